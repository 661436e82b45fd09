"""Transaction kinds: each module builds a Plan (guards + steps) from journaled arguments."""
