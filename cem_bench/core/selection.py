"""``train.select_best_last = N``: test-set model selection as the reference did (docs/reference.md §2, §11.9).

``BestEpoch`` keeps device copies of the client's and server's state of the epoch with the best noisy test
accuracy among the last N epochs (the first of equal epochs wins: the reference's strict ``>``, its running
best reset at epoch 200 of 240), and loads them back before the attack. It imports nothing of the project.
"""

from __future__ import annotations


class BestEpoch:
    def __init__(self, last: int, epochs: int):
        self.last, self.epochs = last, epochs
        self.best: dict | None = None      # {"epoch", "test_acc", "client", "server"}, or None

    def track(self, rec: dict, client, server) -> None:
        """After an epoch (its record ``rec``): keep a copy of the models when the epoch is in the window and
        its noisy test accuracy beats the best so far."""
        if self.last <= 0 or rec["epoch"] <= self.epochs - self.last:
            return
        if self.best is not None and not rec["test_acc"] > self.best["test_acc"]:
            return
        copy = lambda m: {k: v.detach().clone() for k, v in m.state_dict().items()}  # noqa: E731
        self.best = {"epoch": rec["epoch"], "test_acc": rec["test_acc"], "client": copy(client),
                     "server": copy(server)}

    def select(self, client, server, last_epoch: int) -> int:
        """Load the selected epoch's client and server and return that epoch; ``last_epoch`` when selection is
        off (or nothing was selected)."""
        if self.best is None:
            return last_epoch
        client.load_state_dict(self.best["client"])
        server.load_state_dict(self.best["server"])
        return int(self.best["epoch"])

    def load(self, best: dict | None, device) -> None:
        """A checkpoint's ``best`` (or None), its state dicts moved to ``device``."""
        if best is not None:
            move = lambda sd: {k: v.to(device) for k, v in sd.items()}  # noqa: E731
            best = {**best, "client": move(best["client"]), "server": move(best["server"])}
        self.best = best
