/*
 * GPU guard notices as JupyterLab notifications.
 *
 * A prebuilt ("federated") JupyterLab 4 extension written by hand: no webpack, no imports, so
 * the image needs no Node. How JupyterLab loads it:
 * - jupyterlab_server (config.py, get_page_config) lists every
 *   labextensions/<name>/package.json whose jupyterlab._build names `load` (this file, as a
 *   path under that folder) and `extension` (a module name);
 * - the page (jupyterlab/static/bootstrap.js) adds a <script> for `load`, then calls
 *   window._JUPYTERLAB[<name>].init(shareScope);
 * - then (index.out.js, createModule) `await get(extension)` gives a factory; the factory's
 *   result is the module, whose plugins are its `default` where it has an own `__esModule`
 *   property, else the module itself (an array or one plugin).
 * The plugin needs no token: it polls the server extension gpuhub_notices
 * (<base_url>gpuhub/notices) and calls JupyterLab's notification commands; and it shows the
 * participant's own GPU figures (<base_url>gpuhub/usage: their GPU memory against their budget,
 * the GPU's utilisation) as an item of JupyterLab's status bar, placed there by hand (no
 * imports: no IStatusBar token) and put back should the bar be redrawn without it.
 *
 * The file name carries the first 20 hex digits of the SHA-256 of this file, so that no
 * browser keeps an old copy: after any change, rename it and package.json's _build.load
 * (tests/unit/test_notices.py names the new name).
 */
(function () {
  'use strict';

  var NAME = 'gpuhub-notices';
  var POLL_MS = 5000;
  // info notices close by themselves; warnings and errors stay until dismissed
  var INFO_CLOSE_MS = 10000;
  // a notice that no page has shown yet is shown while it is younger than this (seconds):
  // one written while the page was closed still shows on the next load
  var FRESH_S = 3600;
  // ids of notices older than this (seconds) are forgotten: they would not be shown anyway
  var FORGET_S = 86400;
  // JupyterLab cuts a notification's message after 140 characters (toast and list alike)
  var SHOWN_CHARS = 140;
  var DETAILS = 'gpuhub-notices:details';

  function element(tag, className, text) {
    var node = document.createElement(tag);
    node.className = className;
    if (text) {
      node.textContent = text;
    }
    return node;
  }

  /** The whole notice in a dialog dressed as JupyterLab's own (its classes: no imports);
   * placed by its own style, so that it still covers the page should those classes change. */
  function showDetails(title, message) {
    var backdrop = element('div', 'jp-Dialog jp-ThemedContainer gpuhub-notices-details');
    backdrop.style.position = 'fixed';
    backdrop.style.inset = '0';
    backdrop.style.zIndex = '10000';
    var content = element('div', 'jp-Dialog-content');
    var header = element('div', 'jp-Dialog-header', title || 'GPU guard');
    header.style.fontWeight = 'bold';
    var body = element('div', 'jp-Dialog-body', message);
    body.style.whiteSpace = 'pre-wrap';
    var footer = element('div', 'jp-Dialog-footer');
    var ok = element('button', 'jp-Dialog-button jp-mod-accept jp-mod-styled');
    ok.appendChild(element('div', 'jp-Dialog-buttonLabel', 'OK'));
    footer.appendChild(ok);
    content.appendChild(header);
    content.appendChild(body);
    content.appendChild(footer);
    backdrop.appendChild(content);

    function close() {
      document.removeEventListener('keydown', onKey, true);
      backdrop.remove();
    }
    function onKey(event) {
      if (event.key === 'Escape' || event.key === 'Enter') {
        event.preventDefault();
        event.stopPropagation();
        close();
      }
    }
    ok.addEventListener('click', close);
    backdrop.addEventListener('click', function (event) {
      if (event.target === backdrop) {
        close();
      }
    });
    document.addEventListener('keydown', onKey, true);
    document.body.appendChild(backdrop);
    ok.focus();
  }

  var GiB = 1024;

  /** The status bar item of the GPU figures, made (again) where the bar has none. */
  function usageItem() {
    var item = document.getElementById('gpuhub-gpu-usage');
    if (item) {
      return item;
    }
    var bar = document.querySelector('#jp-main-statusbar .jp-StatusBar-Left');
    if (!bar) {
      return null;
    }
    item = element('div', 'jp-StatusBar-Item gpuhub-usage');
    item.id = 'gpuhub-gpu-usage';
    item.hidden = true;
    item.appendChild(element('span', 'jp-StatusBar-TextItem'));
    bar.appendChild(item);
    return item;
  }

  /** "GPU 2.1 / 8.0 GB · 45% busy": the participant's GPU memory against their budget, and how
   * busy their GPU is (all its users together); hidden while there are no current figures. */
  function showUsage(data) {
    var item = usageItem();
    if (!item) {
      return;
    }
    var usage = data && data.usage;
    var stale = typeof data.stale_s === 'number' ? data.stale_s : 60;
    if (!usage || !(data.now - usage.time <= stale)) {
      item.hidden = true;
      return;
    }
    var used = (usage.used_mb / GiB).toFixed(1);
    var text = 'GPU ' + used + (usage.budget_mb ? ' / ' + (usage.budget_mb / GiB).toFixed(1) : '') + ' GB';
    var title = 'Your GPU memory: ' + used + ' GB';
    if (usage.budget_mb) {
      title += ' of your ' + (usage.budget_mb / GiB).toFixed(1) + ' GB budget';
    }
    var over = Boolean(usage.budget_mb) && usage.used_mb > usage.budget_mb;
    if (over) {
      text += ' over budget';
    }
    if (usage.gpu_utilization !== null && usage.gpu_utilization !== undefined) {
      text += ' \u00b7 ' + Math.round(usage.gpu_utilization) + '% busy';
      title += '. The GPU is ' + Math.round(usage.gpu_utilization) + '% busy (everyone on it).';
    }
    item.firstChild.textContent = text;
    item.title = title;
    item.style.color = over ? 'var(--jp-error-color1, #d32f2f)' : '';
    item.style.fontWeight = over ? 'bold' : '';
    item.dataset.usedMb = String(usage.used_mb);
    item.dataset.budgetMb = usage.budget_mb ? String(usage.budget_mb) : '';
    item.hidden = false;
  }

  function activate(app) {
    var settings = app.serviceManager.serverSettings;
    var url = settings.baseUrl + 'gpuhub/notices';
    var usageUrl = settings.baseUrl + 'gpuhub/usage';
    // {notice id: its time}: shown in some page of this server in this browser
    var key = 'gpuhub-notices:shown:' + settings.baseUrl;
    // {notice id: {id: notification id, text, sticky}}: notifications of this page
    var live = {};
    var busy = false;
    var timer = null;

    app.commands.addCommand(DETAILS, {
      label: 'Read the whole GPU guard notice',
      execute: function (args) {
        showDetails(args.title, args.message);
      }
    });

    function loadShown() {
      try {
        var shown = JSON.parse(window.localStorage.getItem(key) || '{}');
        return shown && typeof shown === 'object' && !Array.isArray(shown) ? shown : {};
      } catch (error) {
        return {};
      }
    }

    function saveShown(shown) {
      try {
        window.localStorage.setItem(key, JSON.stringify(shown));
      } catch (error) {
        // storage full or refused: notices may show again after a reload
      }
    }

    /** The notification: the title first, on a line of its own, then the message. */
    function notification(notice) {
      var text = notice.title ? notice.title + '\n' + notice.message : notice.message;
      var options = { autoClose: notice.level === 'info' ? INFO_CLOSE_MS : false };
      if (text.length > SHOWN_CHARS) {
        options.actions = [
          {
            label: 'Read all',
            caption: 'The whole notice',
            commandId: DETAILS,
            args: { title: notice.title, message: notice.message }
          }
        ];
      }
      return { message: text, type: notice.level, options: options };
    }

    async function show(notices, now) {
      if (!app.commands.hasCommand('apputils:notify')) {
        return; // the notification plugin is not there (yet): ask again next time
      }
      var shown = loadShown();
      for (var i = 0; i < notices.length; i++) {
        var notice = notices[i];
        if (!notice || typeof notice.id !== 'string' || typeof notice.message !== 'string') {
          continue;
        }
        var next = notification(notice);
        var mine = live[notice.id];
        if (mine) {
          // rewritten with new numbers while its notification stays up: update it in place
          // (an info toast that closed itself would pop up again: it is left as it was)
          if (mine.sticky && mine.text !== next.message) {
            var kept = await app.commands.execute('apputils:update-notification', {
              id: mine.id,
              message: next.message,
              type: next.type,
              autoClose: next.options.autoClose,
              actions: next.options.actions
            });
            if (kept) {
              mine.text = next.message;
            } else {
              delete live[notice.id]; // dismissed
            }
          }
          continue;
        }
        if (Object.prototype.hasOwnProperty.call(shown, notice.id)) {
          continue;
        }
        if (!(now - notice.time <= FRESH_S)) {
          continue;
        }
        var id = await app.commands.execute('apputils:notify', next);
        live[notice.id] = { id: id, text: next.message, sticky: next.options.autoClose === false };
        shown[notice.id] = notice.time;
        saveShown(shown);
      }
      var forgotten = false;
      for (var seen in shown) {
        if (!(now - shown[seen] <= FORGET_S)) {
          delete shown[seen];
          forgotten = true;
        }
      }
      if (forgotten) {
        saveShown(shown);
      }
    }

    async function poll() {
      if (busy) {
        return;
      }
      busy = true;
      window.clearTimeout(timer);
      try {
        // a hidden page waits: its toasts would be missed, and another page may be in view
        if (!document.hidden) {
          var init = { credentials: 'same-origin', cache: 'no-store', headers: {} };
          if (settings.token) {
            init.headers.Authorization = 'token ' + settings.token;
          }
          var response = await fetch(url, init);
          if (response.ok) {
            var data = await response.json();
            if (data && Array.isArray(data.notices)) {
              // `now` is the server's clock, which the guard's times share
              var now = typeof data.now === 'number' ? data.now : Date.now() / 1000;
              await show(data.notices, now);
            }
          }
          var usage = await fetch(usageUrl, init);
          if (usage.ok) {
            showUsage(await usage.json());
          }
        }
      } catch (error) {
        console.debug('gpuhub-notices: will ask again', error);
      } finally {
        busy = false;
        timer = window.setTimeout(poll, POLL_MS);
      }
    }

    document.addEventListener('visibilitychange', function () {
      if (!document.hidden) {
        void poll();
      }
    });
    app.restored.then(poll);
  }

  var plugin = {
    id: 'gpuhub-notices:plugin',
    description: "Shows the GPU guard's notices (over the GPU memory budget, a process stopped).",
    autoStart: true,
    activate: activate
  };

  window._JUPYTERLAB = window._JUPYTERLAB || {};
  window._JUPYTERLAB[NAME] = {
    // shares no modules and needs none
    init: function () {},
    get: function (module) {
      if (module !== './extension') {
        return Promise.reject(new Error('Module "' + module + '" does not exist in ' + NAME));
      }
      return Promise.resolve(function () {
        return { __esModule: true, default: [plugin] };
      });
    }
  };
})();
