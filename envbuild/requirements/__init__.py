"""The environment a lock describes, proven whole: what each source declares it needs, read from its pinned
tree without running any of its code (:mod:`.declared`, :mod:`.reqfile`, through :mod:`.reading`), the
resolver's roots those requirements add (:mod:`.roots`), and the check that every requirement of every
package and source is met by the lock or waived by name (:mod:`.closure`, from the core metadata
:mod:`.metadata` reads; :mod:`.buildcheck` for what a build needs before it starts).
"""
