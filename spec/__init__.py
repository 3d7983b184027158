"""The z3 checker: prove policy combos safe, or find the scenario that breaks them."""

from policykit.spec.checkable import REFUSED, check_or_refuse, checkable

__all__ = ["REFUSED", "check_or_refuse", "checkable"]
