"""``python -m methods``: every method's and engine's parameters (name, default, allowed values, help)."""
from methods.base import registry
from methods.engine import ENGINE_PARAMS
from methods.params import describe


def main() -> None:
    for title, table, prefix in (("methods", {n: c.Params for n, c in registry().items()}, "method"),
                                 ("engines", ENGINE_PARAMS, "engine")):
        print(f"{title} ({prefix}=NAME, then {prefix}.KEY=VALUE):")
        for name, declaration in table.items():
            print(f"{prefix}={name}")
            for line in describe(prefix, declaration):
                print(line)


if __name__ == "__main__":
    main()
