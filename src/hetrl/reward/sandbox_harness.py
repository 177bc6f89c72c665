"""In-sandbox runner for function-call tests (shipped into the sandbox as a read-only file; stdlib only).

It loads the candidate from solution.py, calls the function of each case in inputs.json (arguments
only: expected values never enter the sandbox) and writes one JSON line per event to the channel
fd. It does not judge anything: the host compares the values it reports. Values must be plain
data of EXACT builtin types (a subclass with its own ``__eq__`` is reported, not encoded).
"""

import json
import math
import os
import sys

_dumps, _write, _type, _exact = json.dumps, os.write, type, (int, float, str, bool, type(None), list, tuple, dict)


def _encode(value, depth=0):
    kind = _type(value)
    if depth > 50 or kind not in _exact:
        raise TypeError(f"{kind.__module__}.{kind.__qualname__}")
    if kind is float and not math.isfinite(value):
        return {"__float__": repr(value)}
    if kind in (list, tuple):
        return {"__seq__": kind.__name__, "items": [_encode(v, depth + 1) for v in value]}
    if kind is dict:
        return {"__dict__": [[_encode(k, depth + 1), _encode(v, depth + 1)] for k, v in value.items()]}
    return value


def main():
    fd = int(os.environ.pop("HETRL_CHANNEL_FD"))

    def send(**record):
        _write(fd, (_dumps(record) + "\n").encode())

    with open("inputs.json") as fh:
        cases = json.load(fh)
    send(event="start", n=len(cases))
    namespace = {"__name__": "solution"}
    try:
        with open("solution.py") as fh:
            exec(compile(fh.read(), "solution.py", "exec"), namespace)
    except SystemExit:
        send(event="exit", where="load")
        return
    except BaseException as exc:
        send(event="load_error", error=_type(exc).__name__)
    for i, case in enumerate(cases):
        try:
            value = namespace[case["fn"]](*case["args"])
        except SystemExit:
            send(event="exit", where=i)
            return
        except BaseException as exc:
            send(event="error", i=i, error=_type(exc).__name__)
            continue
        try:
            encoded = _encode(value)
        except TypeError as exc:
            send(event="untrusted_type", i=i, type=str(exc))
            continue
        except BaseException as exc:
            send(event="error", i=i, error=_type(exc).__name__)
            continue
        send(event="result", i=i, value=encoded)
    planted = sorted(
        n
        for n in os.listdir(".")
        if n in ("conftest.py", "sitecustomize.py", "usercustomize.py", "pytest.ini") or n.endswith(".pth")
    )
    send(event="done", planted=planted)


if __name__ == "__main__":
    sys.setrecursionlimit(10000)
    main()
