"""Every input kdalab draws: the seed's chunk-level families, the sequence-level generator and its
named presets. Studies, check, hunt, the benchmarks and the golden scripts all draw from here."""
