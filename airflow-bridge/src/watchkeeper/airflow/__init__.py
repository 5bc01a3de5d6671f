"""watchkeeper beside Apache Airflow 3.3 (the ``watchkeeper-airflow`` distribution).

Airflow itself is an optional dependency (the ``airflow`` extra): nothing here imports it at
module import time, so the core packages never pay for it.
"""

from __future__ import annotations

__all__: list[str] = []
