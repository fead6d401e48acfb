"""Hostile input against the real stack: malformed requests, floods of followers, lost databases."""
