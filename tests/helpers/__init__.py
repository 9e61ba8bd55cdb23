"""Shared test helpers: independent float64 references and input builders."""
