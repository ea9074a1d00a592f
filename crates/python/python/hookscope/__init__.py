"""hookscope: read and write the internals of language models under one standard set of site
names, on a single forward call or at every step of generation.

    import hookscope
    m = hookscope.Model()                      # the embedded default model; or a directory / hub id
    g = m.generate("The Eiffel Tower is in the city of", max_new_tokens=3,
                   save=["layers.1.layer_output", "next_token_probs"])
    g.saved["layers.1.layer_output@0"].shape   # (1, 10, 32)

Site, step and index syntax is the CLI's (`docs/SCHEMA.md`): `PATTERN[INDEX][@STEPS]`.
`hookscope.Client(url, token=...)` has the same `trace`, `generate` and `sites` for a model
served by `hookscope serve`.
"""

from ._native import Error, InputError, LoadError, Model, Run, SiteError, WriteError
from .client import Client, RemoteRun, ServerError

__all__ = ["Model", "Run", "Error", "LoadError", "SiteError", "WriteError", "InputError",
           "Client", "RemoteRun", "ServerError"]
