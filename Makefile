.PHONY: check test demo fmt lint
check: ## formatting, lints and every test (what CI runs)
	./scripts/test
test: check
demo:
	./scripts/demo
fmt:
	cargo fmt --all
lint:
	cargo clippy --workspace --all-targets -- -D warnings
