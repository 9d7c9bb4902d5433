"""``manage.py simulate_traffic``: post realistic demo leads to a running LeadRouter over HTTP.

    manage.py simulate_traffic                 # 200 leads at 5 per second
    manage.py simulate_traffic --spike 400     # a webinar spike: 400 leads at once
    manage.py simulate_traffic --rate 20 --count 1000 --url http://host:8000

Tokens come from ``seed_demo`` (``var/demo.json``) unless given on the command line.
"""

from __future__ import annotations

import logging
import secrets
import sys
from itertools import islice
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from routing.demo import company
from routing.demo.seed import DemoState, demo_state_path
from routing.demo.traffic import LeadMaker, summary_lines, traffic_outcomes, traffic_post


class Command(BaseCommand):
    help = (
        "Post realistic leads (names, companies, countries, scores, duplicates, junk, competitors) "
        "to the running intake over HTTP, then summarise what routing did with them."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--url", default="http://127.0.0.1:8000", help="LeadRouter's address")
        mode = parser.add_mutually_exclusive_group()
        mode.add_argument(
            "--spike",
            type=int,
            metavar="N",
            help="a webinar spike: N leads from the webinar list, as fast as the server takes them",
        )
        mode.add_argument("--count", type=int, default=200, help="leads at a steady rate")
        parser.add_argument("--rate", type=float, default=5.0, help="leads per second (steady)")
        parser.add_argument("--concurrency", type=int, default=16, help="connections at once")
        parser.add_argument("--seed", type=int, default=None, help="repeat a run's leads")
        parser.add_argument(
            "--wait",
            type=float,
            default=120.0,
            help="seconds to wait for routing to finish before summarising (0: do not wait)",
        )
        parser.add_argument("--form-token", help="token of the website-form source")
        parser.add_argument("--webinar-token", help="token of the webinar source")
        parser.add_argument(
            "--api-token", help="a user's API token (Authorization: Token) to read the outcome"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per request
        state = DemoState.load(demo_state_path())
        tokens = {
            company.FORM_SOURCE: options["form_token"]
            or state.source_tokens.get(company.FORM_SOURCE, ""),
            company.WEBINAR_SOURCE: options["webinar_token"]
            or state.source_tokens.get(company.WEBINAR_SOURCE, ""),
        }
        if not all(tokens.values()):
            raise CommandError(
                "No source tokens: run `manage.py seed_demo` first, or pass --form-token and "
                "--webinar-token."
            )
        for name in ("spike", "count", "concurrency"):
            if options[name] is not None and options[name] < 1:
                raise CommandError(f"--{name} must be at least 1.")
        if options["rate"] <= 0:
            raise CommandError("--rate must be above 0.")
        seed = options["seed"] if options["seed"] is not None else _fresh_seed()
        spike = options["spike"]
        maker = LeadMaker(seed=seed, webinar_share=0.9 if spike else 0.3)
        count = spike or options["count"]
        leads = list(islice(maker, count))
        what = f"a spike of {count}" if spike else f"{count} at {options['rate']:g}/s"
        self.stdout.write(f"Posting {what} to {options['url']} (seed {seed})")
        posted = traffic_post(
            base_url=options["url"],
            tokens=tokens,
            leads=leads,
            rate=None if spike else options["rate"],
            concurrency=options["concurrency"],
            out=sys.stderr,
        )
        if not posted.sent or all(s.status == 0 for s in posted.sent):
            first = posted.sent[0].error if posted.sent else ""
            raise CommandError(f"Could not reach {options['url']}: {first}. Is `make run` up?")
        outcomes = None
        api_token = options["api_token"] or state.api_token
        if options["wait"] > 0 and api_token:
            outcomes = traffic_outcomes(
                base_url=options["url"],
                api_token=api_token,
                lead_ids=[s.lead_id for s in posted.accepted if s.lead_id],
                wait_seconds=options["wait"],
                out=sys.stderr,
            )
        elif options["wait"] > 0:
            self.stdout.write("No API token (seed_demo or --api-token): not reading outcomes.")
        self.stdout.write(self.style.SUCCESS("Summary"))
        for line in summary_lines(posted, outcomes):
            self.stdout.write(f"  {line}")


def _fresh_seed() -> int:
    return secrets.randbelow(1_000_000)
