#!/usr/bin/python3
"""Times one Calculon configuration in-process: the model's evaluation alone, without Python's start-up.

Usage: calculon_eval.py CALCULON_DIR MODEL.json EXECUTION.json SYSTEM.json [repeats] [evaluations per repeat]
Each evaluation is what Calculon's own search does per configuration (build the execution, compile, run,
statistics). Prints one JSON line: the prediction and the median time per evaluation in ms.
"""
import json
import logging
import statistics
import sys
import time

calculon_dir, model_file, execution_file, system_file = sys.argv[1:5]
repeats = int(sys.argv[5]) if len(sys.argv) > 5 else 7
per_repeat = int(sys.argv[6]) if len(sys.argv) > 6 else 20
sys.path.insert(0, calculon_dir)
import calculon  # noqa: E402
from calculon.llm import Llm  # noqa: E402

application = Llm.Application(calculon.io.read_json_file(model_file))
execution = calculon.io.read_json_file(execution_file)
system = calculon.System(calculon.io.read_json_file(system_file))
# At INFO, as `calculon llm` runs: its search's logger has no level and formats every debug record (~10x slower).
log = logging.Logger("calculon", level=logging.INFO)


def evaluate():
    model = Llm(application, log)
    model.compile(system, Llm.Execution.from_json(execution))
    model.run(system)
    return model.get_stats_json(False)


stats = evaluate()  # warm-up; also the prediction
times_ms = []
for _ in range(repeats):
    start = time.perf_counter()
    for _ in range(per_repeat):
        evaluate()
    times_ms.append((time.perf_counter() - start) / per_repeat * 1e3)
print(json.dumps({"step_s": stats["total_time"], "hbm_gib": stats["proc_mem_tier1_cap_req"] / 2**30,
                  "eval_ms": statistics.median(times_ms), "repeats": f"{repeats}x{per_repeat}"}))
