"""Every billing write (docs/billing.md §3-§5; docs/kernle-protocol.md §12.7-12.8), by concern:

* `subscriptions`: the subscription record and the tier it sets (activating and reverting a paid
  period, downgrades, cancellations), and the helpers every write shares.
* `payments`: payment intents, claiming and confirming transfers, the re-check, the treasury watcher.
* `x402`: an agent's upgrade paid over HTTP 402.
* `lifecycle`: the daily run (renewal warnings, grace, expiry, scheduled downgrades).

Money moves a tier only through `subscriptions.activate`, and only for a transfer that
billing.chain says is final enough (PAYMENT_CONFIRMATIONS), correctly addressed, of the exact
amount, from a wallet the organization linked, and mined after the intent was created. One
transfer pays once: the claim is a conditional UPDATE under the payment's row lock, backed by the
partial UNIQUE constraint on (chain_id, tx_hash, log_index), so two concurrent confirms cannot
both win.

`Organization.tier` is the tier every limit reads (accounts.tiers); these services change it in
the same transaction as the subscription, so limits and subscription never disagree.

Every function takes `now` (default: timezone.now()) so the lifecycle can run on a test's clock.
"""
