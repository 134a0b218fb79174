# The two commands the README leads with: `make demo` and `make test`. Each does its own set-up.
SHELL := /bin/bash
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup demo check test test-sanitized test-deploy lint format bench clean

setup:
	bash scripts/setup.sh

demo: setup
	bash scripts/demo.sh

# The edit loop: lint and the fast tests (no training, no servers), under 3 minutes.
check: setup
	bash scripts/check.sh $(PYTEST_ARGS)

test: setup
	bash scripts/test.sh $(PYTEST_ARGS)

# The server suites again, against an ASan/UBSan build of rec-server (build/asan).
test-sanitized: setup
	bash scripts/test_sanitized.sh

# The docker-compose stack in containers (tests/deploy): Docker, root, ~25 min on a cold cache.
test-deploy:
	bash scripts/test_deploy.sh

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format:
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: setup
	$(BIN)/python benchmarks/train_throughput.py

clean:
	rm -rf build runs model_repository
