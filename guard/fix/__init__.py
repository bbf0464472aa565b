"""``ckpt-guard fix``: findings that carry a mechanical fix, planned, applied in one place, verified.

context  -> FixOptions (the command's flags), ActionContext (what an action may touch), Staged
            (what an action wrote, not yet at a final name)
plan     -> the fixes of a Report's findings (plus ``--add`` requests), gated by flags and
            --select / --ignore; the dry-run text
actions  -> the registry: action name -> the function that stages it
patch    -> the text files a plan rewrites, as a `git apply`-ready diff (staged outside the tree)
apply    -> the one place that publishes: staging directory inside the model directory, verification,
            ``NAME.orig`` backups for replaced files, os.replace into the final names, rollback
The actions write checkpoints through ``guard.write``, as convert does: there is no second writer.
"""
