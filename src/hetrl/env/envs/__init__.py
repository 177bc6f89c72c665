"""The shipped environments; each is named in ``hetrl.env.registry.ENVIRONMENTS``."""
