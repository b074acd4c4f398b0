"""Drop-ins for other libraries' KDA call sites, backed by ``kdalab.kernels``
(``kdalab.compat.fla``: fla's ``chunk_kda`` and ``fused_recurrent_kda``, forward only)."""
