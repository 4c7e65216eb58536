"""Verifying USDC payments on the chain itself (docs/billing.md §3-§4; docs/kernle-protocol.md §12.8).

Pure chain logic, no models: the billing services decide what a check means for a payment.

* `node`: the payment chain's configuration, the node client and how its failures surface;
  nothing configured → 503 BillingUnavailable (fail closed), the node not answering → 503
  ChainUnavailable.
* `transfers`: whether one transaction pays an intent, and the treasury's incoming transfers.
* `x402`: an agent's x402 `exact` payment (an EIP-3009 authorization): the 402 answer, the
  header, and every check made before anything is submitted.
* `relayer`: submitting a checked authorization from our relayer account, one at a time.

No log line here carries an RPC URL (it may embed a provider's API key) or a key.
"""
