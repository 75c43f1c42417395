"""Run records (schema, strict loading, atomic writing, constructors), goldens and the seed studies."""
