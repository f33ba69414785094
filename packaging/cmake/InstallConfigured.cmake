# Runs at install time (`cmake --install`, `make install`, CPack), so the paths written into the
# systemd units follow the prefix given then (--prefix), not the one configured:
#   binaries   <prefix>/bin
#   configs    /etc/kvagent for prefix /usr, else <prefix>/etc/kvagent (KVAGENT_CONFIG_DIR wins)
#   units      /lib/systemd/system for prefix /usr, else <prefix>/lib/systemd/system
#              (systemd reads /usr/local/lib/systemd/system; elsewhere `systemctl link` them, or
#              set KVAGENT_SYSTEMD_UNITDIR)
# Set by the caller: KVAGENT_ACTION (units, configs, ldconfig), KVAGENT_SOURCE_DIR,
# KVAGENT_BINARY_DIR, KVAGENT_NAMES (units or configs), KVAGENT_BINDIR, KVAGENT_DOCDIR (relative),
# KVAGENT_CONFIG_DIR / KVAGENT_SYSTEMD_UNITDIR (empty: the defaults above).
set(_prefix "${CMAKE_INSTALL_PREFIX}")
if(_prefix STREQUAL "/usr")
  set(_etc "/etc")
  set(_units "/lib/systemd/system")
else()
  set(_etc "${_prefix}/etc")
  set(_units "${_prefix}/lib/systemd/system")
endif()
set(KVAGENT_BIN_DIR "${_prefix}/${KVAGENT_BINDIR}")
set(KVAGENT_DOC_DIR "${_prefix}/${KVAGENT_DOCDIR}")
if(NOT KVAGENT_CONFIG_DIR)
  set(KVAGENT_CONFIG_DIR "${_etc}/kvagent")
endif()
if(NOT KVAGENT_SYSTEMD_UNITDIR)
  set(KVAGENT_SYSTEMD_UNITDIR "${_units}")
endif()

if(KVAGENT_ACTION STREQUAL "units")
  foreach(unit IN LISTS KVAGENT_NAMES)
    configure_file("${KVAGENT_SOURCE_DIR}/packaging/systemd/${unit}.in"
                   "${KVAGENT_BINARY_DIR}/packaging/systemd/${unit}" @ONLY)
    file(INSTALL DESTINATION "${KVAGENT_SYSTEMD_UNITDIR}" TYPE FILE
         FILES "${KVAGENT_BINARY_DIR}/packaging/systemd/${unit}")
  endforeach()
elseif(KVAGENT_ACTION STREQUAL "configs")
  # An existing config is the operator's: never overwritten (the samples stay in
  # <prefix>/share/kvagent/config).
  foreach(config IN LISTS KVAGENT_NAMES)
    if(EXISTS "$ENV{DESTDIR}${KVAGENT_CONFIG_DIR}/${config}")
      message(STATUS "Kept: $ENV{DESTDIR}${KVAGENT_CONFIG_DIR}/${config}")
    else()
      file(INSTALL DESTINATION "${KVAGENT_CONFIG_DIR}" TYPE FILE
           FILES "${KVAGENT_SOURCE_DIR}/packaging/config/${config}")
    endif()
  endforeach()
elseif(KVAGENT_ACTION STREQUAL "ldconfig")
  # A real install (not staged into DESTDIR for a package, whose trigger runs it) refreshes the
  # dynamic linker's cache so that libkvclient.so.0 is found at once.
  if("$ENV{DESTDIR}" STREQUAL "")
    execute_process(COMMAND ldconfig RESULT_VARIABLE _rc ERROR_VARIABLE _err)
    if(_rc EQUAL 0)
      message(STATUS "ldconfig: the linker cache is refreshed")
    else()
      message(WARNING "ldconfig failed (${_err}); run `sudo ldconfig` before loading libkvclient")
    endif()
  endif()
endif()
