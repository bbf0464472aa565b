"""The Python environments that targets run in when they cannot run here (``guard.envs.registry``).

Finding one (``guard.envs.find``): this process, the Python the user names, a managed environment in the
user's cache directory, or one line naming ``ckpt-guard env install NAME``.  Building one
(``guard.envs.build``) from the constraints files shipped beside this module.  The parent side of the
worker protocol (``guard.envs.worker``, ``guard.envs.protocol``) runs a request in the environment found.
Imports nothing of ``guard`` above the base modules.
"""
