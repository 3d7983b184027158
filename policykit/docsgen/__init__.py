"""Page generators for the documentation site.

Every page under ``docs/generated/`` is written by one of these modules from something that can
be re-run: the plugin registry, the click commands, real scheduler runs, or results files from
``policykit check`` / ``policykit bench``. Nothing in a generated page is typed by hand, so the
site cannot drift from the code it documents. :mod:`policykit.docsgen.site` ties them together;
``policykit docs`` is its command line.
"""
