/**
 * The full-VM machine: QEMU q35 (PCIe, SeaBIOS booting the image's kernel
 * directly), a std VGA display (the guest's bochs DRM driver reads the mode
 * from its EDID), a PS/2 keyboard and a virtio tablet (absolute pointer) for
 * hypervisor-level input, a VNC server on a unix socket for the live view, and
 * a second QMP monitor for the display so screenshots and input never wait
 * behind lifecycle commands on the first.
 */
import { WarrenError } from '../../../errors';
import { feature } from '../../../features';
import { type VmLaunch, type VmmDriver, optPath, qemuBaseArgs, qemuChannelArgs, qemuControl, qemuFinalArgs } from '../microvm/vmm';

export interface Q35Launch extends VmLaunch {
  screen: { width: number; height: number };
  /** The root disk: the sandbox's qcow2 overlay over the read-only base image. */
  overlay: string;
  vncSocket: string;
  displayQmpSocket: string;
}

function isQ35(l: VmLaunch): l is Q35Launch {
  return typeof (l as Q35Launch).overlay === 'string';
}

export const qemuQ35: VmmDriver = {
  name: 'qemu-q35',
  templates: false,
  channel: { kind: 'virtio-serial' },
  control: qemuControl,
  status: () => (feature('qemu').supported ? { available: true } : { available: false, reason: feature('qemu').reason ?? 'no qemu' }),
  command(l) {
    if (!isQ35(l)) throw new WarrenError('INTERNAL', 'the q35 driver needs a display and an overlay disk');
    const args = [
      // A desktop runs much more guest code than a microVM's agent: a bigger translation cache saves retranslation.
      ...qemuBaseArgs(l, 'q35', 64),
      '-device', `VGA,id=video0,edid=on,xres=${l.screen.width},yres=${l.screen.height},vgamem_mb=16`,
      '-device', 'virtio-tablet-pci,id=tablet0',
      // No image locking (see microvm/vmm.ts): the jailed VMM re-opens images by path after dropping privileges.
      '-drive', `id=root,file=${optPath(l.overlay)},format=qcow2,if=none,file.locking=off,discard=unmap`,
      '-device', 'virtio-blk-pci,drive=root,serial=root',
      ...qemuChannelArgs(l, 'virtio-serial-pci'),
      '-chardev', `socket,id=dqmp,path=${optPath(l.displayQmpSocket)},server=on,wait=off`,
      '-mon', 'chardev=dqmp,mode=control',
      '-vnc', `unix:${optPath(l.vncSocket)}`,
    ];
    args.push(...qemuFinalArgs(l));
    return { bin: 'qemu-system-x86_64', args };
  },
};
