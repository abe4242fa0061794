"""Load tests of the service on Locust (`pip install './client[load]'`;
docs/load-testing.md): user classes for generations, sessions and a trainer's
pushes, timed as Locust request entries, and a watcher that fails the run when
a response carries weights older than an update it had seen acknowledged.

Run it with `python -m rollout_client.load` (Locust's own flags and ours) or
`locust -f "$(python -m rollout_client.load --locustfile)"`. Importing this
package imports neither Locust nor gevent: `locustfile.py` does, first."""
