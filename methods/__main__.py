"""``python -m methods``: every method's and engine's parameters (name, default, allowed values, help)."""
from methods.base import registry
from methods.engine import ENGINE_PARAMS
from methods.params import describe


def main() -> None:
    seen: dict[str, str] = {}  # a long help printed once (SAM's hybrids share SAM's parameters)
    for title, table, prefix in (("methods", {n: c.Params for n, c in registry().items()}, "method"),
                                 ("engines", ENGINE_PARAMS, "engine")):
        print(f"{title} ({prefix}=NAME, then {prefix}.KEY=VALUE):")
        for name, declaration in table.items():
            print(f"{prefix}={name}")
            for line in describe(prefix, declaration, seen, owner=f"{prefix}={name}"):
                print(line)


if __name__ == "__main__":
    main()
