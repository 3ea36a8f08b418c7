"""Reading what users write, the same way for every file: bounded, plain-data YAML (:mod:`.yamlfile`),
decoded strictly into frozen dataclasses with every problem at once (:mod:`.typed`, :mod:`.decode`), and
the grammars of the values those files hold: URLs and their redaction (:mod:`.urls`), docker's image
references (:mod:`.reference`). Lockfiles, the config file, recipes and cluster files are all read here;
typed values go back out as JSON through :mod:`.jsonout`, the one serialiser of every report and record."""
