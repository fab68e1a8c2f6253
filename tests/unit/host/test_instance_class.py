"""``bridge_cudagraph.host.instance_class``: mixins put on one object's class and taken off again."""

from __future__ import annotations

from bridge_cudagraph.host import instance_class


def test_instance_mixins_come_off_in_either_order():
    """Two owners extend one object's class (the packed replay's decoder mixin, the forward's deepstack one): each
    takes its own off, in either order, and the other stays; both off gives the host class back."""

    class Host:
        def who(self):
            return ["host"]

    class First:
        def who(self):
            return ["first", *super().who()]

    class Second:
        def who(self):
            return ["second", *super().who()]

    for off in ((First, Second), (Second, First)):
        obj = Host()
        instance_class.extend_instance_class(obj, First)
        instance_class.extend_instance_class(obj, Second)
        assert obj.who() == ["second", "first", "host"]
        instance_class.restore_instance_class(obj, off[0])
        assert obj.who() == [off[1].__name__.lower(), "host"]
        assert isinstance(obj, off[1]) and not isinstance(obj, off[0])
        instance_class.restore_instance_class(obj, off[1])
        assert type(obj) is Host
        instance_class.restore_instance_class(obj, off[1])  # idempotent
        assert type(obj) is Host
