"""Any method of this harness through transformers' ``generate``, in the folder form of ``custom_generate``: a local
folder (or a Hub repository) holding ``custom_generate/generate.py``, whose ``generate`` transformers calls with the
model and everything ``generate`` was given:

    model.generate(input_ids, custom_generate="PATH/TO/THIS/PROJECT", trust_remote_code=True, method="tr",
                   method_params={"tree": "auto"}, tokenizer=tokenizer, max_new_tokens=64, do_sample=False)

``method``, ``method_params`` (the method's parameters, as ``method.KEY=VALUE`` in a config), ``engine``,
``engine_params``, ``budget`` and ``spec_off_above`` (the per-step draft budget, as ``runtime.budget``) choose the
decoder (``tokenizer=``, which generate takes too, where a method sizes its drafts on the project's own prompts:
``tree=auto``); the rest goes back through ``generate``, which prepares the inputs and the generation config and
hands the loop to ``evaluation.api.speculative`` (the callable form). It needs this project installed
(``pip install -e .``), as ``requirements.txt`` beside it says.
"""
from evaluation.api import speculative


def generate(model, *args, method: str = "vanilla", method_params: dict | None = None, engine: str = "static",
             engine_params: dict | None = None, budget: str = "off", spec_off_above: int | None = None, **kwargs):
    kwargs = {k: v for k, v in kwargs.items() if v is not None}  # generate's own arguments that were not given
    call = speculative(method, engine=engine, engine_params=engine_params, tokenizer=kwargs.get("tokenizer"),
                       budget=budget, spec_off_above=spec_off_above, **(method_params or {}))
    return type(model).generate(model, *args, custom_generate=call, **kwargs)
