"""Silent data corruption canaries: known-answer computations checked bit for bit.

Owns the canary suite (exact-integer GEMMs in fp16/bf16/tf32/fp32/fp64,
per-thread integer and FMA chains, a full-mantissa GEMM compared across the
node's GPUs, a short HBM pattern test), its CUDA and CPU backends and a
fault-injecting wrapper, the out-of-process runner with its hard timeout, the
burst schedule, the confirmation of mismatches into findings, and the
canary metric families.

Reads only what the caller passes in: GPU samples (idle state, temperature,
clocks), XID events, the injected clock, and a scenario for simulation. The
daemon drives it all through `agent.CanaryAgent.poll`; `cli.canary` runs the
suite once in the foreground.

Modules that the daemon imports (spec, result, config, schedule, confirm,
crosscheck, stats, export, runner, agent, cli) do not import numpy; the suite
itself (formats, gemm, chains, memory, backends, faults, suite, worker) runs in
the worker process.
"""
