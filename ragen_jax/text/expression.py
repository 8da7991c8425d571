"""Countdown's answer: the first answer piece read as an arithmetic expression inside jit.

The reference (ragen/env/countdown/env.py) scores the stripped first piece `s` of the answer with
    numbers ok  = sorted(int(x) for x in re.findall(r"\\d+", s)) == sorted(task numbers)
    correct     = abs(eval(s, {"__builtins__": None}, {}) - target) < 1e-5   (any exception: False)
    reward      = 0 if not numbers ok else (1 if correct else 0.1)
Here `eval` is restricted to the grammar G of the task: decimal integer literals (Python's: no
leading zeros except "0"), binary + - * /, unary + and -, parentheses; spaces, tabs and form feeds
between tokens, line breaks (\\n, \\r) only inside parentheses (Python joins those lines; at depth 0
they end the expression). A piece outside G cannot be correct (it can still get the 0.1 of right
numbers), and values are exact fractions (envs_jax/countdown.py `evaluate`) with the tolerance checked
exactly. Where this differs from the reference's unrestricted `eval` (deliberately; docs/text_layer.md, "Countdown"):
`**`, `//`, `%`, float / exponent / underscore literals ("1e2", "1.5", "1_2"), comparisons, bit
operators, conditional expressions, line continuations and comments are not arithmetic over the
task's numbers; non-ASCII decimal digits (which Python's `\\d` counts) are not numbers here; a piece of
more than MAX_TOKENS tokens is not evaluated. tests/ragen_jax/text/test_expression.py checks the
in-graph reading against Python's `ast` evaluation of G on generated adversarial strings.

In-graph, per row: byte classes over the decoded buffer, digit runs (values saturated at
NOT_A_NUMBER beyond 3 significant digits), tokens compacted by a prefix sum and one scatter, then a
shunting-yard pass (a loop of at most 2 * MAX_TOKENS + 1 steps, each consuming a token or popping one
operator, that stops when the row is done: under vmap when every row is, a few steps for real answers)
that writes the postfix program, cancelling a unary minus that follows a unary minus. The parser reads
the tokens from the answer's buffer and runs the shunting-yard once, after its choice of buffer size
(`ExpressionParser.finish`, parse.py point 1).
"""

from __future__ import annotations

import ast
import re

import jax
import jax.numpy as jnp
import numpy as np

from envs_jax.countdown import (ADD, ANSWER_NUMS, DIV, MUL, NEG, NOT_A_NUMBER, PAD, PROGRAM_LEN, SUB,
                                Answer)
from ragen_jax.text.parse import Parsed, Parser, shift

MAX_TOKENS = 64
# Token kinds, then the operator-stack codes beyond envs_jax.countdown's (ADD .. NEG).
NUM, T_PLUS, T_MINUS, T_STAR, T_SLASH, T_LPAR, T_RPAR, T_END = range(8)
UPLUS, LPAR = -7, -8
_BINARY = {T_PLUS: ADD, T_MINUS: SUB, T_STAR: MUL, T_SLASH: DIV}
_AST_OPS = {ast.Add: ADD, ast.Sub: SUB, ast.Mult: MUL, ast.Div: DIV}


# ---- host reference (what `parse_text` returns) ----------------------------------------------------
def answer_from_text(piece: str) -> Answer:
    """The Answer of one stripped piece on the host (numpy), G read by Python's `ast`."""
    numbers = [int(x) for x in re.findall(r"[0-9]+", piece)]
    numbers = numbers if len(numbers) <= ANSWER_NUMS else [NOT_A_NUMBER] * ANSWER_NUMS
    numbers = [min(x, NOT_A_NUMBER) for x in numbers] + [-1] * (ANSWER_NUMS - len(numbers))
    program = postfix_of(piece)
    parsed = program is not None and len(program) <= PROGRAM_LEN
    program = (program if parsed else []) + [PAD] * (PROGRAM_LEN - (len(program) if parsed else 0))
    return Answer(numbers=np.asarray(numbers, np.int32), program=np.asarray(program, np.int32),
                  parsed=np.bool_(parsed))


def postfix_of(piece: str) -> list[int] | None:
    """The postfix program of a G expression (None outside G), a minus after a minus cancelled."""
    if "\\" in piece or "#" in piece:
        return None
    try:
        tree = ast.parse(piece, mode="eval").body
    except (SyntaxError, ValueError):
        return None
    out: list[int] = []

    def walk(node) -> bool:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            out.append(min(node.value, NOT_A_NUMBER))
            return True
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
            if not walk(node.operand):
                return False
            if isinstance(node.op, ast.USub):
                if out and out[-1] == NEG:
                    out.pop()
                else:
                    out.append(NEG)
            return True
        if isinstance(node, ast.BinOp) and type(node.op) in _AST_OPS:
            if not (walk(node.left) and walk(node.right)):
                return False
            out.append(_AST_OPS[type(node.op)])
            return True
        return False

    return out if walk(tree) and _literals_are_decimal(piece) else None


def _literals_are_decimal(piece: str) -> bool:
    """ast also takes 0x1F, 1_0, 1e2 and 1j as literals; G takes decimal digits only."""
    return re.search(r"[0-9][A-Za-z_.]|[.][0-9]", piece) is None


# ---- in-graph ------------------------------------------------------------------------------------

def tokens(buf: jax.Array, start, end):
    """Tokens of the piece buf[start:end): (kind int32 [MAX_TOKENS], value int32 [MAX_TOKENS], count,
    numbers int32 [ANSWER_NUMS], lexical_ok). lexical_ok is False for a byte outside G, a line break at
    parenthesis depth 0, a literal with a leading zero, or more than MAX_TOKENS tokens."""
    n = buf.shape[0]
    pos = jnp.arange(n, dtype=jnp.int32)
    b = buf.astype(jnp.int32)
    inp = (pos >= start) & (pos < end)
    digit = inp & (b >= 48) & (b <= 57)
    kinds = jnp.select([b == 43, b == 45, b == 42, b == 47, b == 40, b == 41], [T_PLUS, T_MINUS, T_STAR, T_SLASH,
                                                                                 T_LPAR, T_RPAR], -1)
    sym = inp & (kinds >= 0)
    space = (b == 32) | (b == 9) | (b == 12)
    newline = (b == 10) | (b == 13)
    # Depth before each byte: '(' and ')' counted in the piece only.
    opened = jnp.cumsum(jnp.where(inp & (b == 40), 1, jnp.where(inp & (b == 41), -1, 0))) - jnp.where(
        inp & (b == 40), 1, jnp.where(inp & (b == 41), -1, 0))
    bad = inp & ~(digit | sym | space | (newline & (opened > 0)))
    run_start = digit & ~shift(digit, 1, False)
    run_end = digit & ~jnp.concatenate([digit[1:], jnp.zeros((1,), bool)])
    first = jax.lax.cummax(jnp.where(run_start, pos, -1))  # start of the run a digit is in
    nonzero = jnp.where(digit & (b != 48), pos, n)
    first_nz = jax.lax.cummin(nonzero, reverse=True)[jnp.clip(first, 0, n - 1)]  # first non-zero digit of the run
    sig = jnp.where(first_nz <= pos, pos - first_nz + 1, 0)
    d = [jnp.where(digit & (pos - k >= first), shift(b, k, 48) - 48, 0) for k in range(3)]
    value = jnp.where(sig > 3, NOT_A_NUMBER, d[0] + 10 * d[1] + 100 * d[2])
    leading_zero = run_end & (pos > first) & (buf[jnp.clip(first, 0, n - 1)] == 48)
    n_runs = jnp.sum(run_end, dtype=jnp.int32)
    rank = jnp.cumsum(run_end) - 1
    numbers = jnp.full((ANSWER_NUMS,), -1, jnp.int32).at[jnp.where(run_end, rank, ANSWER_NUMS)].set(
        value, mode="drop")
    numbers = jnp.where(n_runs > ANSWER_NUMS, NOT_A_NUMBER, numbers)
    # Tokens: each operator / parenthesis byte and each digit run.
    starts = sym | run_start
    count = jnp.sum(starts, dtype=jnp.int32)
    index = jnp.cumsum(starts) - 1
    slot = jnp.where(starts, index, MAX_TOKENS)
    kind = jnp.full((MAX_TOKENS,), T_END, jnp.int32).at[slot].set(jnp.where(digit, NUM, kinds), mode="drop")
    tok_value = jnp.zeros((MAX_TOKENS,), jnp.int32).at[jnp.where(run_end, index, MAX_TOKENS)].set(value, mode="drop")
    ok = ~jnp.any(bad) & ~jnp.any(leading_zero) & (count <= MAX_TOKENS)
    return kind, tok_value, count, numbers, ok


def _prec(op):
    return jnp.select([(op == ADD) | (op == SUB), (op == MUL) | (op == DIV), (op == NEG) | (op == UPLUS)], [1, 2, 3], 0)


def to_postfix(kind: jax.Array, value: jax.Array):
    """(program int32 [PROGRAM_LEN], ok): the shunting-yard reading of a token sequence under G."""
    L = kind.shape[0]

    def emit(prog, psp, err, x, do):
        cancel = do & (x == NEG) & (psp > 0) & (prog[jnp.maximum(psp - 1, 0)] == NEG)
        write = do & (x != UPLUS) & ~cancel
        prog = jnp.where(write, prog.at[jnp.minimum(psp, PROGRAM_LEN - 1)].set(x), prog)
        psp = psp + jnp.where(write, 1, 0) - jnp.where(cancel, 1, 0)
        return prog, psp, err | (write & (psp > PROGRAM_LEN))

    def step(c):
        n, i, expect, ops, osp, prog, psp, err, done = c
        live = ~err & ~done
        tk = jnp.where(i < L, kind[jnp.minimum(i, L - 1)], T_END)
        top = jnp.where(osp > 0, ops[jnp.maximum(osp - 1, 0)], 0)
        top_op = (osp > 0) & (top != LPAR)
        binop = jnp.select([tk == T_PLUS, tk == T_MINUS, tk == T_STAR, tk == T_SLASH], [ADD, SUB, MUL, DIV], 0)
        is_bin = binop != 0
        # Operand position: a number, a prefix sign or '('.
        e_num = live & expect & (tk == NUM)
        e_push = live & expect & ((tk == T_PLUS) | (tk == T_MINUS) | (tk == T_LPAR))
        e_err = live & expect & ~(e_num | e_push)
        push_code = jnp.select([tk == T_PLUS, tk == T_MINUS], [UPLUS, NEG], LPAR)
        # Operator position.
        o = live & ~expect
        pop = o & top_op & ((is_bin & (_prec(top) >= _prec(binop))) | (tk == T_RPAR) | (tk == T_END))
        o_push = o & is_bin & ~pop
        close = o & (tk == T_RPAR) & (osp > 0) & ~top_op
        o_err = o & ~(pop | o_push | close | is_bin) & ~((tk == T_END) & (osp == 0))
        finish = o & (tk == T_END) & (osp == 0)
        prog, psp, err2 = emit(prog, psp, err, jnp.where(pop, top, value[jnp.minimum(i, L - 1)]), pop | e_num)
        pushing = e_push | o_push
        ops = jnp.where(pushing, ops.at[jnp.minimum(osp, L - 1)].set(jnp.where(e_push, push_code, binop)), ops)
        osp = osp + jnp.where(pushing, 1, 0) - jnp.where(pop | close, 1, 0)
        i = i + jnp.where(e_num | pushing | close, 1, 0)
        expect = jnp.where(e_num, False, jnp.where(o_push, True, expect))
        return (n + 1, i, expect, ops, osp, prog, psp, err2 | e_err | o_err, done | finish)

    # Each step consumes a token or pops an operator, so 2 * L + 1 steps always suffice; the loop stops
    # when the row is done (under vmap: when every row is), which for real answers is a few steps.
    def going(c):
        n, *_, err, done = c
        return (n < 2 * L + 1) & ~err & ~done

    init = (jnp.int32(0), jnp.int32(0), jnp.bool_(True), jnp.zeros((L,), jnp.int32), jnp.int32(0),
            jnp.full((PROGRAM_LEN,), PAD, jnp.int32), jnp.int32(0), jnp.bool_(False), jnp.bool_(False))
    _, _, _, _, _, prog, psp, err, done = jax.lax.while_loop(going, step, init)
    prog = jnp.where(jnp.arange(PROGRAM_LEN) < psp, prog, PAD)
    return prog, done & ~err


def read_answer(buf: jax.Array, start, end) -> Answer:
    """The Answer of the piece buf[start:end) (jittable, one row)."""
    kind, value, _, numbers, lexical_ok = tokens(buf, start, end)
    program, syntax_ok = to_postfix(kind, value)
    return Answer(numbers=numbers, program=program, parsed=lexical_ok & syntax_ok)


class ExpressionParser(Parser):
    """A Parser whose one action is the first answer piece read as an expression (`Parsed.answer`).

    `actions` is [0, -1, ...] with num_actions 1 when the answer has a non-empty piece, so the format
    penalty applies as the reference's: only when the regex fails or the answer is empty."""

    needs_names = False

    def __init__(self, tokenizer, max_actions_per_turn: int, think: bool = True, max_tokens: int = 400,
                 emit_ids=None):
        super().__init__(tokenizer, (), max_actions_per_turn, think=think, max_tokens=max_tokens,
                         emit_ids=emit_ids)

    def read_pieces(self, buf, starts, ends, kept, ok) -> Parsed:
        """The first piece's tokens (`answer` holds them until `finish` writes the postfix program)."""
        k = self.max_actions_per_turn
        some = ok & (kept > 0)
        kind, value, _, numbers, lexical_ok = tokens(buf, jnp.where(some, starts[0], 0), jnp.where(some, ends[0], 0))
        return Parsed(actions=jnp.where((jnp.arange(k) == 0) & some, 0, -1).astype(jnp.int32),
                      num_actions=some.astype(jnp.int32), format_ok=ok, has_invalid=jnp.bool_(False),
                      answer=(kind, value, numbers, lexical_ok))

    def finish(self, parsed: Parsed) -> Parsed:
        kind, value, numbers, lexical_ok = parsed.answer
        program, syntax_ok = to_postfix(kind, value)
        return parsed.replace(answer=Answer(numbers=numbers, program=program, parsed=lexical_ok & syntax_ok))

    def parse_text(self, text: str) -> Parsed:
        k = self.max_actions_per_turn
        pieces = self.text_pieces(text)
        some = bool(pieces)
        actions = np.full((k,), -1, np.int32)
        actions[0] = 0 if some else -1
        return Parsed(actions, np.int32(some), np.bool_(pieces is not None), np.bool_(False),
                      answer=answer_from_text(pieces[0] if some else ""))


__all__ = ["MAX_TOKENS", "ExpressionParser", "answer_from_text", "postfix_of", "read_answer", "to_postfix",
           "tokens"]
