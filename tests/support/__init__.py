"""What tests (and scripts) share: model builders, oracles, the random-weight zoo, the classic
memory planners, the conformance suite's expected failures."""
