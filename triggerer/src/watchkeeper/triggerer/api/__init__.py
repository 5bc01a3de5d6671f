"""The operator's HTTP surface: health, metrics, the REST API, tokens and the web page.

``serve_api`` runs it inside any task group (the daemon's, ``watchkeeper api``'s, or
``watchkeeper up``'s); ``create_app`` builds the Starlette application alone (for tests).

The modules: ``_app`` (the routes table, errors as JSON), ``_base`` (the context,
authentication, JSON shapes), ``_health`` (health, readiness, metrics, OpenAPI), ``_assets``
(assets and state), ``_events`` (events and the live stream) with ``_feed`` (the read of the
event log a stream's clients share), ``_watchers`` (watchers and daemons) with ``_rates``
(their events per minute), ``_tasks`` (tasks
and runs), ``_tokens``, ``_hooks`` (``POST /hooks/{asset}``, webhooks) with ``_signatures``
(the senders' signature schemes), ``_scoping`` (what each scope sees of runs and watchers),
``_metrics`` with ``_task_metrics`` (the task series, read from the store), ``_openapi`` with
``_schemas`` (its body schemas) and ``_openapi_hooks`` (the webhook route's part),
``_page`` and ``static/`` (the web page) with ``_views`` (the read routes of its watcher view
and asset graph) and ``_series`` (the watchers' last hour, sampled in memory), ``_headers`` (security headers), ``_server``
(uvicorn in the caller's task group, TLS) with ``_guard`` (connection and header-time limits,
the open-file budget).

It may import the store, the authoring API and the public names (``__all__``) of
:mod:`.._core`, the runtime and the daemon; never the CLI or the test kit.
"""

from __future__ import annotations

from ._app import ApiContext, ApiError, create_app
from ._metrics import LoopLagProbe, Metrics
from ._server import ApiListenError, api_context, serve_api, serve_app
from ._tokens import Principal, check_scope, make_token, verify_token

__all__ = [
    "ApiContext",
    "ApiError",
    "ApiListenError",
    "LoopLagProbe",
    "Metrics",
    "Principal",
    "api_context",
    "check_scope",
    "create_app",
    "make_token",
    "serve_api",
    "serve_app",
    "verify_token",
]
