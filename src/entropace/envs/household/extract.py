"""Rebuild ``alfred_tables.json`` from an ALFWorld wheel (run once by maintainers, not at runtime).

Usage::

    pip download --no-deps alfworld==0.4.2 -d /tmp/alfworld
    python -m entropace.envs.household.extract /tmp/alfworld/alfworld-0.4.2-py3-none-any.whl

It reads, from ALFWorld 0.4.2 (MIT licence, Shridhar et al. 2021):

* ``alfworld/gen/constants.py``: ``VAL_RECEPTACLE_OBJECTS`` (which object type a receptacle type
  can contain: the ``canContain`` facts of ALFWorld's PDDL problems), ``VAL_ACTION_OBJECTS``
  (cleanable / heatable / coolable / toggleable object types), ``OPENABLE_CLASS_LIST``,
  ``GOALS_VALID`` (which room types each task type is generated in) and ``SCENE_TYPE``;
* ``alfworld/gen/layouts/FloorPlan<N>-objects.json`` and ``-openable.json``: the object types and
  the receptacle instances of each of the 120 AI2-THOR floor plans ALFWorld's games are built on.

Everything is lower-cased to ALFWorld's text names (``SinkBasin`` -> ``sinkbasin``).
"""

from __future__ import annotations

import collections
import importlib.util
import json
import re
import sys
import tempfile
import zipfile
from pathlib import Path

OUT = Path(__file__).with_name("alfred_tables.json")
#: THOR receptacle names in the layouts -> the receptacle ALFWorld's text games use.
_ALIASES = {"Sink": "SinkBasin", "Bathtub": "BathtubBasin"}


def extract(wheel: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(wheel) as zf:
        zf.extract("alfworld/gen/constants.py", tmp)
        spec = importlib.util.spec_from_file_location(
            "alf_constants", f"{tmp}/alfworld/gen/constants.py"
        )
        assert spec is not None and spec.loader is not None
        c = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(c)
        layouts = {
            name: json.loads(zf.read(name))
            for name in zf.namelist()
            if re.search(r"FloorPlan\d+-(objects|openable)\.json$", name)
        }
    movable = set(c.MOVABLE_RECEPTACLES)
    static_receptacles = set(c.VAL_RECEPTACLE_OBJECTS) - movable
    can_contain = {
        r.lower(): sorted({o.lower() for o in objs if "Sliced" not in o})
        for r, objs in sorted(c.VAL_RECEPTACLE_OBJECTS.items())
        if r in static_receptacles
    }
    room_of = {n: room for room, numbers in c.SCENE_TYPE.items() for n in numbers}
    scenes = {}
    for n in sorted(room_of):
        objects = layouts.get(f"alfworld/gen/layouts/FloorPlan{n}-objects.json")
        openable = layouts.get(f"alfworld/gen/layouts/FloorPlan{n}-openable.json")
        if objects is None or openable is None:
            continue
        counts = collections.Counter(
            _ALIASES.get(k.split("|")[0], k.split("|")[0]) for k in openable
        )
        for t in objects:  # receptacles with no navigation point in the layout: one instance
            t = _ALIASES.get(t, t)
            if t in static_receptacles and t not in counts:
                counts[t] = 1
        receptacles = {t.lower(): k for t, k in sorted(counts.items()) if t in static_receptacles}
        object_types = sorted(
            {o.lower() for o in objects if o not in static_receptacles and o not in _ALIASES}
        )
        scenes[str(n)] = {"room": room_of[n], "receptacles": receptacles, "objects": object_types}
    actions = {
        k.lower(): sorted({o.lower() for o in v if "Sliced" not in o})
        for k, v in c.VAL_ACTION_OBJECTS.items()
    }
    return {
        "source": "alfworld 0.4.2 (MIT): alfworld/gen/constants.py and alfworld/gen/layouts/",
        "can_contain": can_contain,
        "cleanable": actions["cleanable"],
        "heatable": actions["heatable"],
        "coolable": actions["coolable"],
        "toggleable": actions["toggleable"],
        "openable": sorted(t.lower() for t in c.OPENABLE_CLASS_LIST if t in static_receptacles),
        "goals_valid": {g: sorted(rooms) for g, rooms in c.GOALS_VALID.items()},
        "scenes": scenes,
    }


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        raise SystemExit(__doc__)
    tables = extract(argv[0])
    OUT.write_text(json.dumps(tables, indent=1, sort_keys=True) + "\n")
    print(f"wrote {OUT} ({len(tables['scenes'])} scenes)")


if __name__ == "__main__":
    main()
