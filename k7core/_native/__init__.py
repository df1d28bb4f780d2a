"""Private native kernel (cffi)."""
