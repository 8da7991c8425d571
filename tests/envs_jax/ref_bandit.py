"""Plain-Python Bi-arm Bandit written from the reference's rules (RAGEN ragen/env/bandit/env.py),
independent of the JAX code. Randomness (presentation order, the high arm's jackpot, RAGEN-2's name
pair) is an input.
"""

from __future__ import annotations

INIT_PROMPT = """You are playing a bandit game. Goal: Maximize your total reward by choosing which arm to pull. 
Game Rules: 
1. There are 2 arms, named {name_a} and {name_b}
2. Each arm has its own reward distribution, related to their names. 
3. Analyze the symbolic meaning of each arm's name to guess how their reward distribution might behave.
4. Based on the symbolic meaning of their names, which arm do you think is more likely to give higher rewards on average? Choose between {name_a} and {name_b}, and output like <answer> {name_a} </answer> or <answer> {name_b} </answer>.
"""


class BanditRef:
    def __init__(self, lo_name, hi_name, high_first, lo_score=0.1, hi_score=1.0, hi_loscore=0.0):
        # The reference's ACTION_LOOKUP: position 1 and 2 hold the names in presentation order.
        self.lookup = {1: hi_name, 2: lo_name} if high_first else {1: lo_name, 2: hi_name}
        self.lo_name, self.hi_name = lo_name, hi_name
        self.scores = (lo_score, hi_score, hi_loscore)
        self.done = False
        self.pulled = None

    def render(self):
        return INIT_PROMPT.format(name_a=self.lookup[1], name_b=self.lookup[2])

    def step(self, name, jackpot):
        """Pull the arm called `name` (any case) -> (reward, done, success)."""
        if self.done:
            return 0.0, False, self.pulled == self.hi_name
        by_name = {v.lower(): v for v in self.lookup.values()}
        self.pulled = by_name[name.lower()]
        lo, hi, hi_lo = self.scores
        reward = lo if self.pulled == self.lo_name else (hi if jackpot else hi_lo)
        self.done = True
        return reward, True, self.pulled == self.hi_name


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


def ragen2_step(game: BanditRef, name: str, jackpot: bool):
    """RAGEN-2's turn: es_manager._extract_map_valid_actions keeps only names of the CURRENT action
    lookup; a turn without a valid action executes nothing -> None. Else game.step."""
    if name.lower() not in {v.lower() for v in game.lookup.values()}:
        return None
    return game.step(name, jackpot)
