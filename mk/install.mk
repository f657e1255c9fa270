# install.mk - `make install` and `make uninstall` (included by the Makefile).
#
#   make install [PREFIX=/usr/local] [DESTDIR=/staging]      everything below, under DESTDIR
#   make uninstall [PREFIX=...] [DESTDIR=...]                removes exactly what install put there
#
# Every directory can be set on its own; the defaults follow PREFIX. Configuration goes under
# /etc when PREFIX is /usr, else under PREFIX/etc (Xen only looks in /etc/xen/scripts: install
# with PREFIX=/usr, or set XENSCRIPTDIR). debian/rules shows a distribution's settings.

PREFIX         ?= /usr/local
BINDIR         ?= $(PREFIX)/bin
LIBDIR         ?= $(PREFIX)/lib
INCLUDEDIR     ?= $(PREFIX)/include
PKGCONFIGDIR   ?= $(LIBDIR)/pkgconfig
MANDIR         ?= $(PREFIX)/share/man
SYSCONFDIR     ?= $(if $(filter /usr,$(PREFIX)),/etc,$(PREFIX)/etc)
XENSCRIPTDIR   ?= $(SYSCONFDIR)/xen/scripts
SYSTEMDUNITDIR ?= $(PREFIX)/lib/systemd/system

INSTALL ?= install

PUBLIC_HDRS  := libparallax/include/parallax.h libparallax/backend/parallax_backend.h
XEN_SCRIPTS  := xen-configs/block-parallax xen-configs/block-parallax-tap \
                xen-configs/parallax-hotplug-common.sh
MAN_PAGES    := docs/man/parallax.8 docs/man/libparallax.3
SERVE_CONFS  := $(wildcard systemd/*.conf)

# The pkg-config file and the systemd unit get the install paths written into them.
PC_SED   := -e 's|@LIBDIR@|$(LIBDIR)|g' -e 's|@INCLUDEDIR@|$(INCLUDEDIR)|g' \
            -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@VERSION@|$(PLX_VERSION)|g'
UNIT_SED := -e 's|@BINDIR@|$(BINDIR)|g' -e 's|@SYSCONFDIR@|$(SYSCONFDIR)|g'

install: all
	$(INSTALL) -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(LIBDIR) $(DESTDIR)$(INCLUDEDIR) \
	    $(DESTDIR)$(PKGCONFIGDIR) $(DESTDIR)$(MANDIR)/man8 $(DESTDIR)$(MANDIR)/man3 \
	    $(DESTDIR)$(XENSCRIPTDIR) $(DESTDIR)$(SYSTEMDUNITDIR) \
	    $(DESTDIR)$(SYSCONFDIR)/parallax/serve
	$(INSTALL) -m 755 $(B)/parallax $(DESTDIR)$(BINDIR)/parallax
	$(INSTALL) -m 755 $(B)/parallax-lockd $(DESTDIR)$(BINDIR)/parallax-lockd
	$(INSTALL) -m 644 $(B)/libparallax.so.$(PLX_VERSION) $(DESTDIR)$(LIBDIR)/
	ln -sf libparallax.so.$(PLX_VERSION) $(DESTDIR)$(LIBDIR)/$(SONAME)
	ln -sf $(SONAME) $(DESTDIR)$(LIBDIR)/libparallax.so
	$(INSTALL) -m 644 $(B)/libparallax.a $(DESTDIR)$(LIBDIR)/
	$(INSTALL) -m 644 $(PUBLIC_HDRS) $(DESTDIR)$(INCLUDEDIR)/
	sed $(PC_SED) mk/parallax.pc.in > $(DESTDIR)$(PKGCONFIGDIR)/parallax.pc
	$(INSTALL) -m 644 docs/man/parallax.8 $(DESTDIR)$(MANDIR)/man8/
	$(INSTALL) -m 644 docs/man/libparallax.3 $(DESTDIR)$(MANDIR)/man3/
	$(INSTALL) -m 755 $(XEN_SCRIPTS) $(DESTDIR)$(XENSCRIPTDIR)/
	sed $(UNIT_SED) systemd/parallax-serve@.service.in > $(DESTDIR)$(SYSTEMDUNITDIR)/parallax-serve@.service
	$(INSTALL) -m 644 $(SERVE_CONFS) $(DESTDIR)$(SYSCONFDIR)/parallax/serve/

# Removes the files install made, then the directories that belong to Parallax alone (only if
# empty: a configuration someone added stays).
uninstall:
	rm -f $(DESTDIR)$(BINDIR)/parallax $(DESTDIR)$(BINDIR)/parallax-lockd
	rm -f $(DESTDIR)$(LIBDIR)/libparallax.so.$(PLX_VERSION) $(DESTDIR)$(LIBDIR)/$(SONAME) \
	    $(DESTDIR)$(LIBDIR)/libparallax.so $(DESTDIR)$(LIBDIR)/libparallax.a
	rm -f $(addprefix $(DESTDIR)$(INCLUDEDIR)/,$(notdir $(PUBLIC_HDRS)))
	rm -f $(DESTDIR)$(PKGCONFIGDIR)/parallax.pc
	rm -f $(DESTDIR)$(MANDIR)/man8/parallax.8 $(DESTDIR)$(MANDIR)/man3/libparallax.3
	rm -f $(addprefix $(DESTDIR)$(XENSCRIPTDIR)/,$(notdir $(XEN_SCRIPTS)))
	rm -f $(DESTDIR)$(SYSTEMDUNITDIR)/parallax-serve@.service
	rm -f $(addprefix $(DESTDIR)$(SYSCONFDIR)/parallax/serve/,$(notdir $(SERVE_CONFS)))
	for d in $(DESTDIR)$(SYSCONFDIR)/parallax/serve \
	    $(DESTDIR)$(SYSCONFDIR)/parallax; do rmdir "$$d" 2>/dev/null || true; done

.PHONY: install uninstall
