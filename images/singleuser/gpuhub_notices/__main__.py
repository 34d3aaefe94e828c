"""``python3 -m gpuhub_notices``: the participant's GPU memory now and the latest GPU guard
notices, for ``gpu-info``; nothing at all where there are none."""

from __future__ import annotations

import sys
import time

from .notices import format_notices, read_notices, recent
from .usage import describe, read_usage


def main(argv: list[str]) -> int:
    if argv:
        print("usage: python3 -m gpuhub_notices", file=sys.stderr)
        return 2
    now = time.time()
    usage = describe(read_usage(), now)
    if usage:
        print(usage)
    notices = read_notices()
    if notices:
        print("GPU guard notices (latest last):")
        print(format_notices(recent(notices, now), now))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
