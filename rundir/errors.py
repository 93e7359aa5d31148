"""The one exception type for mistakes a user can cause (bad flags, missing files, wrong run dir).

The CLI turns it into a single line on stderr and a non-zero exit; nothing is written before it is raised.
"""


class UserError(Exception):
    """A problem the user can fix; the message says what to do."""
