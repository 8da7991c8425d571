"""The bi-arm Bandit in plain Python, written from the reference's rules (RAGEN ragen/env/bandit/env.py
and RAGEN-2's config.py). Randomness (presentation order, the high arm's jackpot, RAGEN-2's name pair)
is an input or drawn from a `random.Random`."""

from __future__ import annotations

import random

INIT_PROMPT = """You are playing a bandit game. Goal: Maximize your total reward by choosing which arm to pull. 
Game Rules: 
1. There are 2 arms, named {name_a} and {name_b}
2. Each arm has its own reward distribution, related to their names. 
3. Analyze the symbolic meaning of each arm's name to guess how their reward distribution might behave.
4. Based on the symbolic meaning of their names, which arm do you think is more likely to give higher rewards on average? Choose between {name_a} and {name_b}, and output like <answer> {name_a} </answer> or <answer> {name_b} </answer>.
"""

# RAGEN-2 ragen/env/bandit/config.py ARM_NAMES (split -> (lo, hi) pairs), copied from the reference.
ARM_NAMES = {
    "train": [
        ("Teacher", "Trader"), ("Nurse", "StartupFounder"), ("Librarian", "Investor"),
        ("Accountant", "StockBroker"), ("Engineer", "RealEstateAgent"), ("Pharmacist", "Musician"),
        ("Clerk", "Freelancer"), ("Technician", "Youtuber"), ("Planner", "Artist"), ("Postman", "Pilot"),
        ("Banker", "VentureCapitalist"), ("Gardener", "Cryptominer"),
    ],
    "test": [
        ("Receptionist", "Explorer"), ("Archivist", "Filmmaker"), ("Bookkeeper", "Consultant"),
        ("SocialWorker", "Photographer"), ("Mechanic", "GameDesigner"), ("Secretary", "Entrepreneur"),
        ("Cashier", "DataScientist"), ("CivilServant", "StartupAccelerator"),
    ],
}
LOW, HIGH = 0, 1  # action indices: the low-risk arm, the high-risk arm


class BanditState:
    __slots__ = ("high_first", "arm", "time", "done")

    def __init__(self, high_first, arm=-1, time=0, done=False):
        self.high_first, self.arm, self.time, self.done = bool(high_first), int(arm), int(time), bool(done)

    def copy(self) -> "BanditState":
        return BanditState(self.high_first, self.arm, self.time, self.done)


class Bandit:
    """The rules: one pull per episode, the low arm pays `low_reward`, the high arm `high_reward` on a
    jackpot (probability `high_prob`) else `high_fail_reward`."""

    answer_format = "action"  # step(state, action index)

    def __init__(self, low_name="Phoenix", high_name="Dragon", low_reward=0.1, high_reward=1.0,
                 high_fail_reward=0.0, high_prob=0.25, max_steps: int = 1):
        self.low_name, self.high_name = low_name, high_name
        self.low_reward, self.high_reward, self.high_fail_reward = low_reward, high_reward, high_fail_reward
        self.high_prob, self.max_steps = high_prob, max_steps
        self.action_names = (low_name, high_name)

    def step(self, s: BanditState, action: int, rng: random.Random):
        return self.apply_draw(s, action, rng.random() < self.high_prob)

    def apply_draw(self, s: BanditState, action: int, jackpot: bool):
        """-> (state, reward, done, info); the state is updated in place."""
        if s.done:
            return s, 0.0, True, {"action_is_effective": False, "success": s.arm == HIGH}
        s.arm = HIGH if action >= HIGH else LOW
        reward = (self.high_reward if jackpot else self.high_fail_reward) if s.arm == HIGH else self.low_reward
        s.time += 1
        s.done = True
        return s, reward, True, {"action_is_effective": True, "success": s.arm == HIGH}

    def render(self, s: BanditState) -> str:
        a, b = (self.high_name, self.low_name) if s.high_first else (self.low_name, self.high_name)
        return INIT_PROMPT.format(name_a=a, name_b=b)


class BanditRef:
    """One episode as the reference's env object plays it: the arms by name, in presentation order (its
    ACTION_LOOKUP holds the names at positions 1 and 2), on the rules of `Bandit`."""

    def __init__(self, lo_name, hi_name, high_first, lo_score=0.1, hi_score=1.0, hi_loscore=0.0):
        self.lookup = {1: hi_name, 2: lo_name} if high_first else {1: lo_name, 2: hi_name}
        self.lo_name, self.hi_name = lo_name, hi_name
        self.rules = Bandit(lo_name, hi_name, lo_score, hi_score, hi_loscore)
        self.state = BanditState(high_first)

    @property
    def done(self) -> bool:
        return self.state.done

    def render(self):
        return self.rules.render(self.state)

    def step(self, name, jackpot):
        """Pull the arm called `name` (any case) -> (reward, done, success); an ended episode pays 0."""
        if self.state.done:
            return 0.0, False, self.state.arm == HIGH
        pulled = {v.lower(): v for v in self.lookup.values()}[name.lower()]
        _, reward, done, info = self.rules.apply_draw(self.state, HIGH if pulled == self.hi_name else LOW, jackpot)
        return reward, done, info["success"]


def ragen2_step(game: BanditRef, name: str, jackpot: bool):
    """RAGEN-2's turn: es_manager._extract_map_valid_actions keeps only names of the CURRENT action
    lookup; a turn without a valid action executes nothing -> None. Else game.step."""
    if name.lower() not in {v.lower() for v in game.lookup.values()}:
        return None
    return game.step(name, jackpot)


def from_jax(state) -> BanditState:
    return BanditState(bool(state.high_first), int(state.arm), int(state.time), bool(state.done))
