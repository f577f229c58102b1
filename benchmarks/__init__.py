"""Benchmarks that print numbers: each figure a ratio against a baseline measured in the same command.

Each is one function of its module, `bench_NAME(cfg, json_out, **options)`: it runs on the config's settings,
prints its table, writes its figures to `json_out` when given and returns them. BENCHES names them for
`trainflow bench NAME` (cli/bench.py) and `trainflow bench all` (benchmarks/suite.py); this module imports
nothing, so that the command line lists the benchmarks without loading torch.
"""

REPEATS = 3  # rounds of every configuration in every bench: figures are the median with its min-max

BENCHES = {
    "train": "benchmarks.training:bench_training",
    "frameworks": "benchmarks.frameworks:bench_frameworks",
    "staging": "benchmarks.staging:bench_staging",
    "loader": "benchmarks.loader:bench_loader",
    "scale": "benchmarks.scale:bench_scale",
    "images": "benchmarks.images:bench_images",
    "all": "benchmarks.suite:bench_all",
    "gpu": "benchmarks.gpu:bench_gpu",
    "parallel": "benchmarks.parallel:bench_parallel",
    "flow": "benchmarks.overhead:bench_flow",
    "install": "benchmarks.install:bench_install",
    "script": "benchmarks.script:bench_script",
}
