"""Supervised warm start on solver demonstrations (behaviour spec section 8: SFT on 1k BFS-solver
trajectories reached 74.6% on Sokoban): teachers write demos through the compiled rollout, the
SFT trainer fits the policy to them and exports it for RL (`--config.model.init_from=<workdir>`)."""

from ragen_jax.sft.teachers import AnswerTable, BanditTeacher, FrozenLakeTeacher, SokobanTeacher, get_teacher

__all__ = ["AnswerTable", "BanditTeacher", "FrozenLakeTeacher", "SokobanTeacher", "SFTTrainer", "get_teacher"]


def __getattr__(name):  # the trainer pulls in the model and optimizer stack: import it on demand
    if name == "SFTTrainer":
        from ragen_jax.sft.trainer import SFTTrainer

        return SFTTrainer
    raise AttributeError(name)
