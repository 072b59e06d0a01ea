"""Which device owns each expert: placements, routing statistics, strategies, the cost model, plans."""
