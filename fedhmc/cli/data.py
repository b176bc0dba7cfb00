"""``fedhmc data``: how a dataset splits over clients, as a table and a heat-map."""

from __future__ import annotations

import argparse

from fedhmc.errors import ConfigError

DATA_OPTIONS = {
    "dataset",
    "num_clients",
    "partition",
    "dirichlet_alpha",
    "min_client_size",
    "classes_per_client",
    "quantity_sigma",
    "dim",
    "data_dir",
    "download",
    "scaling",
    "seed",
}


def add_data_command(sub) -> None:
    from fedhmc.cli.options import add_config_options

    p = sub.add_parser(
        "data",
        help="show how a dataset splits over clients (table, heat-map)",
        description="Load a dataset, split it over clients, and print one row per client: "
        "size, label counts and label entropy (bits).",
    )
    add_config_options(p, only=DATA_OPTIONS)
    p.add_argument("--plot", metavar="FILE", help="save a clients × classes heat-map (.png/.pdf)")
    p.add_argument("--list", action="store_true", help="list datasets and partitioners")
    p.set_defaults(func=cmd_data)


def cmd_data(args: argparse.Namespace) -> int:
    from fedhmc_datasets.partition import PARTITIONERS, format_partition_table, plot_label_heatmap

    from fedhmc.cli.options import config_from_args
    from fedhmc.runtime.presets import DATASET_CHOICES, GAUSSIAN_TARGETS
    from fedhmc.runtime.problem import load_client_data

    if args.list:
        print("datasets:     " + ", ".join(DATASET_CHOICES))
        print("partitioners: " + ", ".join(PARTITIONERS))
        return 0
    cfg = config_from_args(args).resolve()
    if cfg.dataset in GAUSSIAN_TARGETS:
        raise ConfigError(
            f"{cfg.dataset} is a synthetic target with no data to split; "
            "`fedhmc run --dataset gaussian-hetero` samples it"
        )
    try:
        data, parts = load_client_data(cfg)
    except (MemoryError, RuntimeError) as e:
        from fedhmc_datasets.memory import is_out_of_memory, out_of_memory_detail

        if not is_out_of_memory(e):
            raise
        raise ConfigError(
            f"out of memory while loading {cfg.to_dict()['dataset']} "
            f"({out_of_memory_detail(e)}); use less data, or a machine with more memory"
        ) from None
    n_train, n_test = int(data.y_train.shape[0]), int(data.y_test.shape[0])
    print(
        f"{cfg.dataset}: {n_train:,} train / {n_test:,} test, {data.num_features} features, "
        f"{data.num_classes} classes; {data.description}"
    )
    alpha = f", α = {cfg.dirichlet_alpha:g}" if cfg.partition == "dirichlet" else ""
    print(f"partition {cfg.partition} over {cfg.num_clients} clients{alpha} (seed {cfg.seed})")
    print(format_partition_table(data.y_train, parts, data.num_classes))
    if args.plot:
        title = f"{cfg.dataset}: {cfg.partition}{alpha} over {cfg.num_clients} clients"
        path = plot_label_heatmap(data.y_train, parts, data.num_classes, args.plot, title=title)
        print(f"heat-map saved to {path}")
    return 0
