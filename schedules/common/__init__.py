"""What every schedule shares: target presets and the host (targets), argument checks,
compiled-op plumbing (compiled), the blocked layouts and their compiled transforms (layouts),
and the TVMScript toolkit the templates are written with (tir)."""
