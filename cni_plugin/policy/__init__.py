"""Policy inside a VPC (SPEC §17): MultiNetworkPolicy and NetworkPolicy, one compiler for both
(`model`, `compile`, `world`), rendered for where each kind of attachment is enforced: an
nftables table in a veth Pod's netns (`nft`), stateful tc filters on a tap (`tc`).
docs/architecture.md, "Policy inside a VPC", says why there."""
