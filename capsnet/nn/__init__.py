"""The building blocks: routing, capsule layers and losses."""
