"""Transactions: a transactional producer's epochs and its transactions' decisions (the
coordinator), the writes a transaction prepared in each partition (the participants), and the end
of a transaction (docs/transactions.md)."""
