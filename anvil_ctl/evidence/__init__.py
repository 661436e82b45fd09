"""Evidence bundles (written, verified, exported, read) and what is made of them:
the one-page report, its plots, the summary table and the claim ledger."""
