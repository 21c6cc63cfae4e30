"""Template tags of django_leader's admin pages."""
