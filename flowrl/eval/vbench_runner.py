"""Runs inside VBench's own environment (see flowrl/eval/vbench.py): stdlib + the vbench package only, never flowrl,
whose dependencies that environment does not share. Usage: python vbench_runner.py REQUEST.json"""

import json
import os
import sys


def main(request_path: str) -> None:
    # this file's folder (flowrl/eval, with flowrl's own vbench.py) must not shadow the vbench package
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    import vbench
    from vbench import VBench

    request = json.load(open(request_path))
    full_info = os.path.join(os.path.dirname(vbench.__file__), "VBench_full_info.json")
    bench = VBench(request["device"], full_info, request["output"])
    # local=True: weights from VBENCH_CACHE_DIR (flowrl checked they are there), never a hub
    bench.evaluate(
        videos_path=request["videos"],
        name=request["name"],
        prompt_list=request["prompts"],
        dimension_list=request["dimensions"],
        local=True,
        mode="custom_input",
    )


if __name__ == "__main__":
    main(sys.argv[1])
