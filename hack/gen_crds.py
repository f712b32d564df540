#!/usr/bin/env python3
"""Regenerate the STUNner CRDs in charts/stunner/crds/ from stunner_api/crds.py.

    python hack/gen_crds.py          # write the files
    python hack/gen_crds.py --check  # exit 1 (and name the files) if they are out of date

Only the stunner.l7mp.io_*.yaml files are ours: a stale one (a CRD no longer generated) is
removed, anything else in the directory is left alone.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from stunner_api.crds import CRDS_DIR, render_all  # noqa: E402
from stunner_api.vocabulary import STUNNER_GROUP  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check, write nothing")
    parser.add_argument("--out", type=Path, default=ROOT / CRDS_DIR, help="output directory")
    args = parser.parse_args(argv)

    wanted = render_all()
    out: Path = args.out
    stale = (
        sorted(p for p in out.glob(f"{STUNNER_GROUP}_*.yaml") if p.name not in wanted)
        if out.is_dir()
        else []
    )
    changed = [
        name
        for name, text in wanted.items()
        if not (out / name).is_file() or (out / name).read_text(encoding="utf-8") != text
    ]
    if args.check:
        for name in changed:
            print(f"{out / name}: out of date, run python hack/gen_crds.py", file=sys.stderr)
        for path in stale:
            print(f"{path}: not generated any more, run python hack/gen_crds.py", file=sys.stderr)
        return 1 if changed or stale else 0
    out.mkdir(parents=True, exist_ok=True)
    for name in changed:
        (out / name).write_text(wanted[name], encoding="utf-8")
        print(f"wrote {out / name}")
    for path in stale:
        path.unlink()
        print(f"removed {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
