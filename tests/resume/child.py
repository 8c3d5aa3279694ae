"""``python -m tests.resume.child SCENARIO STATE OUT``: a new process loads a saved state into a
fresh loader of the named scenario and writes the batches of the rest of the run as JSON."""

from __future__ import annotations

import json
import sys

import torch

from tests.resume.scenarios import SCENARIOS, Split, second_half


def main(scenario: str, state_path: str, out_path: str, epoch: int, epochs: int) -> None:
    state = torch.load(state_path, weights_only=True)  # plain values only: no pickled objects
    split = Split(epoch, batches=0)
    rest = second_half(SCENARIOS[scenario](), state, split, epochs)
    with open(out_path, "w") as out:
        json.dump(rest, out)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
