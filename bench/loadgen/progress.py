"""A progress bar over answered requests: tqdm when installed, else a line every 10%."""
from __future__ import annotations

import sys
from collections import Counter


class Progress:
    def __init__(self, total: int, enabled: bool = True, desc: str = "requests") -> None:
        self.total, self.enabled, self.desc = total, enabled, desc
        self.counts: Counter[str] = Counter()
        self._bar = None
        self._tenths = 0  # tenths of the total reported so far (no tqdm)
        if enabled:
            try:
                from tqdm import tqdm
            except ImportError:
                return
            self._bar = tqdm(total=total, desc=desc, unit="req", dynamic_ncols=True)

    def update(self, outcome: str) -> None:
        """One request got its terminal answer (`outcome`)."""
        self.counts[outcome] += 1
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.set_postfix(self.counts, refresh=False)
            self._bar.update(1)
            return
        done = sum(self.counts.values())
        tenths = done * 10 // max(self.total, 1)
        if tenths > self._tenths:
            self._tenths = tenths
            print(f"{self.desc}: {done}/{self.total} answered ({dict(self.counts)})", file=sys.stderr)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
