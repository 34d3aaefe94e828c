/*
 * The GPU guard's notices as JupyterLab notifications, and the participant's own GPU figures in
 * JupyterLab's status bar.
 *
 * Its server side is the Jupyter server extension gpuhub_notices: the plugin polls
 * <base_url>gpuhub/notices (the guard's notices: over the GPU memory budget, a process stopped)
 * and <base_url>gpuhub/usage (their GPU memory against their budget, the GPU's utilisation).
 *
 * Built with JupyterLab's extension tooling into
 * images/singleuser/sys-prefix/share/jupyter/labextensions/gpuhub-notices: after a change run
 * `make labextension` and commit what it writes (docs/development.md).
 */

import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { Dialog } from '@jupyterlab/apputils';
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';
import { IStatusBar } from '@jupyterlab/statusbar';
import { Signal } from '@lumino/signaling';
import { Widget } from '@lumino/widgets';

const POLL_MS = 5000;
// info notices close by themselves; warnings and errors stay until dismissed
const INFO_CLOSE_MS = 10000;
// a notice that no page has shown yet is shown while it is younger than this (seconds):
// one written while the page was closed still shows on the next load
const FRESH_S = 3600;
// ids of notices older than this (seconds) are forgotten: they would not be shown anyway
const FORGET_S = 86400;
// JupyterLab cuts a notification's message after 140 characters (toast and list alike)
const SHOWN_CHARS = 140;
// the usage figures are current while younger than this, unless the server says (seconds)
const STALE_S = 60;
const MiB_PER_GB = 1024;
const DETAILS = 'gpuhub-notices:details';

/** One notice as gpuhub/notices gives it (gpuhub_notices/notices.py). */
interface INotice {
  id: string;
  level: 'info' | 'warning' | 'error';
  time: number;
  title: string;
  message: string;
}

/** The participant's figures as gpuhub/usage gives them (gpuhub_notices/usage.py). */
interface IUsage {
  time: number;
  used_mb: number;
  budget_mb: number | null;
  gpu_utilization: number | null;
}

interface IUsageAnswer {
  now: number;
  stale_s?: number;
  usage: IUsage | null;
}

/** A notice's notification in this page. */
interface ILive {
  id: string;
  text: string;
  sticky: boolean;
}

/** The arguments of the command apputils:notify (a type, not an interface: JSON for execute). */
type NotificationArgs = {
  message: string;
  type: string;
  options: {
    autoClose: number | false;
    actions?: {
      label: string;
      caption: string;
      commandId: string;
      args: { title: string; message: string };
    }[];
  };
};

/** The whole notice in a JupyterLab dialog (the notification shows 140 characters). */
function showDetails(title: string, message: string): void {
  const body = new Widget();
  body.node.textContent = message;
  body.node.style.whiteSpace = 'pre-wrap';
  const dialog = new Dialog({
    title: title || 'GPU guard',
    body,
    buttons: [Dialog.okButton({ label: 'OK' })]
  });
  dialog.addClass('gpuhub-notices-details');
  void dialog.launch().then(() => dialog.dispose());
}

/**
 * The status bar item of the GPU figures: "GPU 2.1 / 8.0 GB · 45% busy", the participant's
 * GPU memory against their budget, and how busy their GPU is (all its users together); in red
 * over budget; hidden while there are no current figures.
 */
class UsageItem extends Widget {
  readonly activeStateChanged = new Signal<this, void>(this);
  private _text: HTMLSpanElement;
  private _active = false;

  constructor() {
    super();
    this.id = 'gpuhub-gpu-usage';
    this.addClass('gpuhub-usage');
    this._text = document.createElement('span');
    this._text.className = 'jp-StatusBar-TextItem';
    this.node.appendChild(this._text);
  }

  get active(): boolean {
    return this._active;
  }

  showFigures(data: IUsageAnswer): void {
    const usage = data && data.usage;
    const stale = typeof data.stale_s === 'number' ? data.stale_s : STALE_S;
    if (!usage || !(data.now - usage.time <= stale)) {
      this._setActive(false);
      return;
    }
    const used = (usage.used_mb / MiB_PER_GB).toFixed(1);
    const budget = usage.budget_mb ? (usage.budget_mb / MiB_PER_GB).toFixed(1) : '';
    let text = 'GPU ' + used + (budget ? ' / ' + budget : '') + ' GB';
    let title = 'Your GPU memory: ' + used + ' GB';
    if (budget) {
      title += ' of your ' + budget + ' GB budget';
    }
    const over = Boolean(usage.budget_mb) && usage.used_mb > (usage.budget_mb as number);
    if (over) {
      text += ' over budget';
    }
    if (usage.gpu_utilization !== null && usage.gpu_utilization !== undefined) {
      const busy = Math.round(usage.gpu_utilization);
      text += ' \u00b7 ' + busy + '% busy';
      title += '. The GPU is ' + busy + '% busy (everyone on it).';
    }
    this._text.textContent = text;
    this.node.title = title;
    // on the text itself: the status bar's stylesheet gives .jp-StatusBar-TextItem its colour
    this._text.style.color = over ? 'var(--jp-error-color1, #d32f2f)' : '';
    this._text.style.fontWeight = over ? 'bold' : '';
    this.node.dataset.usedMb = String(usage.used_mb);
    this.node.dataset.budgetMb = usage.budget_mb ? String(usage.budget_mb) : '';
    this._setActive(true);
  }

  private _setActive(active: boolean): void {
    if (active !== this._active) {
      this._active = active;
      this.activeStateChanged.emit();
    }
  }
}

function activate(app: JupyterFrontEnd, statusBar: IStatusBar | null): void {
  const settings = app.serviceManager.serverSettings;
  const url = URLExt.join(settings.baseUrl, 'gpuhub/notices');
  const usageUrl = URLExt.join(settings.baseUrl, 'gpuhub/usage');
  // {notice id: its time}: shown in some page of this server in this browser
  const key = 'gpuhub-notices:shown:' + settings.baseUrl;
  // {notice id: its notification}: notifications of this page
  const live: { [id: string]: ILive } = {};
  let busy = false;
  let timer: number | undefined;

  let usageItem: UsageItem | null = null;
  if (statusBar) {
    const item = new UsageItem();
    statusBar.registerStatusItem('gpuhub-notices:usage', {
      item,
      align: 'left',
      rank: 1000, // after JupyterLab's own items
      isActive: () => item.active,
      activeStateChanged: item.activeStateChanged
    });
    usageItem = item;
  }

  app.commands.addCommand(DETAILS, {
    label: 'Read the whole GPU guard notice',
    execute: args => {
      showDetails(String(args.title ?? ''), String(args.message ?? ''));
    }
  });

  function loadShown(): { [id: string]: number } {
    try {
      const shown = JSON.parse(window.localStorage.getItem(key) || '{}');
      return shown && typeof shown === 'object' && !Array.isArray(shown) ? shown : {};
    } catch (error) {
      return {};
    }
  }

  function saveShown(shown: { [id: string]: number }): void {
    try {
      window.localStorage.setItem(key, JSON.stringify(shown));
    } catch (error) {
      // storage full or refused: notices may show again after a reload
    }
  }

  /** The notification: the title first, on a line of its own, then the message. */
  function notification(notice: INotice): NotificationArgs {
    const text = notice.title ? notice.title + '\n' + notice.message : notice.message;
    const options: NotificationArgs['options'] = {
      autoClose: notice.level === 'info' ? INFO_CLOSE_MS : false
    };
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
    return { message: text, type: notice.level, options };
  }

  async function show(notices: INotice[], now: number): Promise<void> {
    if (!app.commands.hasCommand('apputils:notify')) {
      return; // the notification plugin is not there (yet): ask again next time
    }
    const shown = loadShown();
    for (const notice of notices) {
      if (!notice || typeof notice.id !== 'string' || typeof notice.message !== 'string') {
        continue;
      }
      const next = notification(notice);
      const mine = live[notice.id];
      if (mine) {
        // rewritten with new numbers while its notification stays up: update it in place
        // (an info toast that closed itself would pop up again: it is left as it was)
        if (mine.sticky && mine.text !== next.message) {
          const kept = await app.commands.execute('apputils:update-notification', {
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
      const id = await app.commands.execute('apputils:notify', next);
      live[notice.id] = {
        id,
        text: next.message,
        sticky: next.options.autoClose === false
      };
      shown[notice.id] = notice.time;
      saveShown(shown);
    }
    let forgotten = false;
    for (const seen of Object.keys(shown)) {
      if (!(now - shown[seen] <= FORGET_S)) {
        delete shown[seen];
        forgotten = true;
      }
    }
    if (forgotten) {
      saveShown(shown);
    }
  }

  async function poll(): Promise<void> {
    if (busy) {
      return;
    }
    busy = true;
    window.clearTimeout(timer);
    try {
      // a hidden page waits: its toasts would be missed, and another page may be in view
      if (!document.hidden) {
        const init: RequestInit = { cache: 'no-store' };
        const response = await ServerConnection.makeRequest(url, init, settings);
        if (response.ok) {
          const data = await response.json();
          if (data && Array.isArray(data.notices)) {
            // `now` is the server's clock, which the guard's times share
            const now = typeof data.now === 'number' ? data.now : Date.now() / 1000;
            await show(data.notices, now);
          }
        }
        const usage = await ServerConnection.makeRequest(usageUrl, init, settings);
        if (usage.ok && usageItem) {
          usageItem.showFigures(await usage.json());
        }
      }
    } catch (error) {
      console.debug('gpuhub-notices: will ask again', error);
    } finally {
      busy = false;
      timer = window.setTimeout(poll, POLL_MS);
    }
  }

  document.addEventListener('visibilitychange', () => {
    if (!document.hidden) {
      void poll();
    }
  });
  void app.restored.then(poll);
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'gpuhub-notices:plugin',
  description: "Shows the GPU guard's notices (over the GPU memory budget, a process stopped).",
  autoStart: true,
  optional: [IStatusBar],
  activate
};

export default plugin;
