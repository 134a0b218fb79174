"""rec.serve: starting servers on a model repository, sending requests, measuring them."""
