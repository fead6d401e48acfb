"""Webhooks: which events exist, which URLs may receive them, and the loop that delivers them.

State changes reach ``webhook_events`` through database triggers (migration 0012), in the
transaction that makes them; :mod:`.delivery` fans each one out to the subscribed webhooks and
POSTs the signed bodies outside any transaction.
"""
